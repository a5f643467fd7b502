-- now: the server's clock (ms), read on the node of KEYS[1] (a stream's delayed set),
-- the node whose clock due.lua promotes by. A delay's due time is computed from it,
-- never from the worker's clock.
--
-- KEYS: delayed set (for routing only). Returns the time in ms.
local t = redis.call('TIME')
return t[1] * 1000 + math.floor(t[2] / 1000)
