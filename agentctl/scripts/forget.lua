-- forget.lua: a parked request was published again; it is forgotten only if it is
-- still the one published (a request parked again meanwhile, under a new id, stays).
--
-- KEYS: parked (hash agent -> request). ARGV: agent, the request as read.
-- Returns 1 when forgotten.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
