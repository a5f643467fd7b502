-- void.lua: a run ended; its open reservation, if any, is void (what it spent was
-- reported, or never will be). Only the run's own field: a newer run's stays.
--
-- KEYS: res. ARGV: field.
return redis.call('HDEL', KEYS[1], ARGV[1])
