-- ask.lua: a run whose budget ran out starts asking for more, once per budget level
-- (the raises so far). The level's field "ask:<level>" is "asked" once the comment is
-- posted, or "asking <until_ms> <lock> <token>" while a run posts it. A run asks
-- unless the level was asked, or another run is asking: its lease held (its lock holds
-- its token) and its deadline ahead. The same run asks again (a retry of its failed
-- post); a dead asker's (lease gone) or a late one's ask is taken over.
-- ("asked:<level>" = "1" is the mark of earlier versions, taken before the post.)
--
-- KEYS: ledger. ARGV: lock, token, now_ms, deadline_ms.
-- Returns {"post" | "asked" | "busy", level}.
local ledger = KEYS[1]
local level = tonumber(redis.call('HGET', ledger, 'raised') or '0')
local field = 'ask:' .. level
if redis.call('HGET', ledger, 'asked:' .. level) then return {'asked', level} end
local v = redis.call('HGET', ledger, field)
if v == 'asked' then return {'asked', level} end
if v then
  local untl, lock, token = string.match(v, '^asking (%d+) (%S+) (%S+)$')
  if untl and token ~= ARGV[2] and tonumber(untl) > tonumber(ARGV[3]) and redis.call('GET', lock) == token then
    return {'busy', level}
  end
end
redis.call('HSET', ledger, field, 'asking ' .. (tonumber(ARGV[3]) + tonumber(ARGV[4])) .. ' ' .. ARGV[1] .. ' ' .. ARGV[2])
return {'post', level}
