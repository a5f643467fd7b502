-- release.lua (after lease.lua): give the lease back; see release in lease.lua.
--
-- KEYS: lock, info, done. ARGV: token, message_id.
return release(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
