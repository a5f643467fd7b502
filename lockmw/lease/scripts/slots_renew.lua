-- slots_renew.lua: a run's heartbeat keeps its slots: each holder (KEYS[i], token
-- ARGV[1]) still naming the token frees ttl_ms (ARGV[2]) from now (server time). A slot
-- that is gone (expired: the run was presumed dead) is not taken again: the reply counts
-- the ones renewed.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local n = 0
for i = 1, #KEYS do
  if redis.call('ZSCORE', KEYS[i], ARGV[1]) then
    redis.call('ZADD', KEYS[i], now + tonumber(ARGV[2]), ARGV[1])
    n = n + 1
  end
end
return n
