-- release: compare-and-delete. A foreign lease (another token, or a Python
-- agent's plain key) is never deleted. A release records when (server time) and for
-- which message it happened, for the superseded checks: the done record is
-- "<released_ms> <message_id> <last_follow_up_ms>".
--
-- KEYS: lock, info, done. ARGV: token.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local mid = redis.call('HGET', KEYS[2], 'message_id')
redis.call('DEL', KEYS[1], KEYS[2])
if mid and mid ~= '' then
  local t = redis.call('TIME')
  local prev = string.match(redis.call('GET', KEYS[3]) or '', '^%d+ %S+ (%d+)') or '0'
  redis.call('SET', KEYS[3], (t[1] * 1000 + math.floor(t[2] / 1000)) .. ' ' .. mid .. ' ' .. prev, 'PX', 86400000)
end
return 1
