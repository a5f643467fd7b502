-- pause: pause a budget for everyone for ARGV[1] ms (the server's clock), never
-- shortening a longer pause already set. The key's value says who set it.
--
-- KEYS: the pause key. ARGV: ms, who.
-- Returns the pause in effect, in ms.
local ms = tonumber(ARGV[1])
local left = redis.call('PTTL', KEYS[1])
if left < ms then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ms)
  return ms
end
return left
