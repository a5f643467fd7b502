-- acquire.lua (after lease.lua): take the lease; see acquire in lease.lua.
--
-- KEYS: lock, info, fence, done. ARGV: token, ttl_ms, owner, acquired_at_ms,
-- message_id, entry_ms or ''.
return acquire(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
