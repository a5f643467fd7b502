-- due: the delayed events of a set that are due by the server's clock (never earlier
-- than their delay, whatever the caller's clock says), and when the next one is due.
-- It changes nothing: the caller appends each (once, by an id taken from the member)
-- and then removes it, so a crash in between appends nothing twice.
--
-- KEYS: delayed set. ARGV: most members returned.
-- Returns {score of the next one not due or '', member, ...}.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local nxt = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local out = {nxt[2] or ''}
for _, m in ipairs(due) do table.insert(out, m) end
return out
