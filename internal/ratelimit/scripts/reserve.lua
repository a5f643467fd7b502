-- reserve.lua: book the next free slot of a budget, on the same GCRA state as
-- redis_rate's allow (the key, and the theoretical arrival time in seconds since
-- 2017-01-01, the value redis_rate reads and writes), so that Permit's callers and
-- Wait's share one budget. Unlike allow, a caller that must wait is given the slot it
-- waits for: the next caller's is one interval later. Callers are then served in the
-- order they asked, however late each wakes from its sleep.
-- KEYS: the GCRA key. ARGV: burst, rate, period (seconds), most (seconds: a slot
-- further out than this is not booked).
-- Returns {1, wait}: booked, the caller's in wait seconds (0: now); {0, wait}: not
-- booked, the first free slot is wait seconds away.
local key = KEYS[1]
local burst, rate, period, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local interval = period / rate
local t = redis.call('TIME')
local now = (t[1] - 1483228800) + (t[2] / 1000000)
local tat = math.max(tonumber(redis.call('GET', key) or '') or now, now)
local new_tat = tat + interval
local wait = math.max(new_tat - interval * burst - now, 0)
if wait > most then return {0, tostring(wait)} end
redis.call('SET', key, new_tat, 'EX', math.ceil(new_tat - now))
return {1, tostring(wait)}
