-- raise.lua: a maintainer's approval raises the issue's budget by ARGV[2] micro-USD,
-- once per approval (ARGV[1] names it: a repeat adds nothing).
--
-- KEYS: ledger. ARGV: once, micro. Returns the raise in total.
if redis.call('HSETNX', KEYS[1], 'raise:' .. ARGV[1], ARGV[2]) == 1 then
  return redis.call('HINCRBY', KEYS[1], 'raised', ARGV[2])
end
return tonumber(redis.call('HGET', KEYS[1], 'raised') or '0')
