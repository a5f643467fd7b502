-- force_release: the operator's override. It deletes whatever holds the lease and
-- bumps the fence so that the evicted holder's fenced writes are refused from now on.
--
-- KEYS: lock, info, fence. Returns the new fence.
redis.call('DEL', KEYS[1], KEYS[2])
return redis.call('INCR', KEYS[3])
