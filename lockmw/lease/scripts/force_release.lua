-- force_release: the operator's override. It deletes whatever holds the lease, bumps
-- the fence so that the evicted holder's fenced writes are refused from now on, and
-- announces the eviction ("<lock key> <new fence>" on the Pub/Sub channel ARGV[1]) so
-- that the holder stops at once instead of at its next heartbeat.
--
-- KEYS: lock, info, fence. ARGV: channel. Returns the new fence.
redis.call('DEL', KEYS[1], KEYS[2])
local f = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', ARGV[1], KEYS[1] .. ' ' .. f)
return f
