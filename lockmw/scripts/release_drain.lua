-- release_drain is release.lua for the coalesce policy: after deleting our lease
-- it takes the queued follow-up, if any, and returns it (field, value, ...) for the
-- caller to publish; on standalone Redis (ARGV[2] = "1") it appends it to its stream
-- itself, so a crash cannot lose it between take and publish.
--
-- KEYS: lock, info, queue, done. ARGV: token, inline_xadd, maxlen.
local released = 0
local q = redis.call('HGETALL', KEYS[3])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local mid = redis.call('HGET', KEYS[2], 'message_id')
  redis.call('DEL', KEYS[1], KEYS[2])
  if mid and mid ~= '' then
    local t = redis.call('TIME')
    local now = t[1] * 1000 + math.floor(t[2] / 1000)
    local rq = string.match(redis.call('GET', KEYS[4]) or '', '^%d+ %S+ (%d+)') or '0'
    if #q > 0 then rq = now end
    redis.call('SET', KEYS[4], now .. ' ' .. mid .. ' ' .. rq, 'PX', 86400000)
  end
  released = 1
end
if #q == 0 then return {released} end
redis.call('DEL', KEYS[3])
if ARGV[2] ~= '1' then return {released, 0, unpack(q)} end
local stream = ''
local args = {'XADD', '', 'MAXLEN', '~', ARGV[3], '*'}
if tonumber(ARGV[3]) <= 0 then args = {'XADD', '', '*'} end
for i = 1, #q, 2 do
  if q[i] == '_stream' then stream = q[i+1]
  else table.insert(args, q[i]); table.insert(args, q[i+1]) end
end
args[2] = stream
local id = redis.call(unpack(args))
return {released, 1, id}
