-- permit.lua: book the next permit of an upstream, in the order asked (GCRA with
-- reservation: the theoretical arrival time, tat, moves one interval per permit
-- booked, so every caller gets a slot of its own and none is passed over by callers
-- that happen to ask a little sooner). Times in microseconds of the server's clock.
-- KEYS: tat, hold, shrink. ARGV: interval_us (at the full rate), burst, horizon_us.
-- Returns {1, wait_us, epoch}: booked, the caller's in wait_us; epoch is the shrink
-- key's value (names the latest 429), for the caller to see whether a 429 came before
-- its slot. {0, wait_us}: not booked (paused after a 429, or more than horizon_us of
-- permits booked already): ask again after wait_us.
local hold = redis.call('PTTL', KEYS[2])
if hold > 0 then return {0, hold * 1000} end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval = tonumber(ARGV[1])
local epoch = redis.call('GET', KEYS[3])
if epoch then interval = interval * 2 end -- half the rate after a 429
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0') or 0, now)
local at = math.max(tat - (tonumber(ARGV[2]) - 1) * interval, now)
local horizon = tonumber(ARGV[3])
if at - now > horizon then return {0, at - now - horizon} end
tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1000)
return {1, at - now, epoch or ''}
