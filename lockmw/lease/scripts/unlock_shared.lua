-- unlock_shared.lua (after lease.lua): the release of shared keys held in another hash
-- slot than their lease's own keys (a group key on Redis Cluster); see release_shared.
--
-- KEYS: lock, info[, lock, info]... ARGV: token.
release_shared(ARGV[1], 1)
return 1
