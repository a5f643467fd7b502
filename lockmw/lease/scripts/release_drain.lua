-- release_drain is release.lua for the coalesce policy: it gives the lease back and
-- publishes the issue's queued follow-up, if any, so that the follow-up is never lost
-- between being taken and being published.
--
-- On standalone Redis (mode '1') it does it all in one atomic step: release, take the
-- follow-up, XADD it to its stream. On Redis Cluster (mode '0') the stream is in another
-- slot, so it is a loop the caller drives: while a follow-up is queued that the caller
-- has not published (its _qid differs from published_qid), the script returns it
-- ({3, field, value, ...}) and changes nothing; the caller publishes it (once, by its
-- _qid) and calls again; only then does the script release and delete the slot.
--
-- The queue of a lease held by someone else is never touched; the queue of a lease
-- that nobody holds (ours expired) is drained, so its follow-up is not stranded. A
-- repeat after a lost reply finds the lease gone and the queue empty: it does nothing.
--
-- The deliver policy's queued event (field _mbox) stands for the follow-ups in the
-- mailbox (KEYS[5]): when the run accounted for all of them (the mailbox is empty) it
-- is dropped, not published, and the empty mailbox is deleted.
--
-- KEYS: lock, info, queue, done[, mailbox]. ARGV: token, mode, maxlen, published_qid
-- ('' if none), issue, index max, index TTL (ms): the follow-up is filed in the issue's
-- index of its stream as xonce's script files every entry (internal/xonce/xadd_once.lua).
-- Returns {released}, {released, 1, new id} (standalone), {released, 2} (cluster: the
-- published follow-up's slot deleted) or {3, field, value, ...}.
local mine = redis.call('GET', KEYS[1]) == ARGV[1]
local q = {}
if mine or redis.call('EXISTS', KEYS[1]) == 0 then q = redis.call('HGETALL', KEYS[3]) end
local qid, mbox = '', false
for i = 1, #q, 2 do
  if q[i] == '_qid' then qid = q[i + 1] end
  if q[i] == '_mbox' then mbox = true end
end
if mbox and KEYS[5] and redis.call('XLEN', KEYS[5]) == 0 then
  redis.call('DEL', KEYS[3], KEYS[5])
  q = {}
end
if ARGV[2] ~= '1' and #q > 0 and qid ~= ARGV[4] then
  return {3, unpack(q)}
end
local released = 0
if mine then
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
if ARGV[2] ~= '1' then return {released, 2} end
local stream = ''
local args = {'XADD', '', 'MAXLEN', '~', ARGV[3], '*'}
if tonumber(ARGV[3]) <= 0 then args = {'XADD', '', '*'} end
for i = 1, #q, 2 do
  if q[i] == '_stream' then stream = q[i+1]
  elseif q[i] ~= '_qid' and q[i] ~= '_mbox' then table.insert(args, q[i]); table.insert(args, q[i+1]) end
end
args[2] = stream
local id = redis.call(unpack(args))
if ARGV[5] and ARGV[5] ~= '' then
  -- xonce.IndexKey and IndexSinceKey: in the stream's hash slot.
  local tag = stream
  if not string.find(stream, '^[^{]*{[^}]+}') then tag = '{' .. stream .. '}' end
  local idx = tag .. ':issue:' .. ARGV[5]
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  redis.call('ZADD', idx, ms, ms .. '-' .. string.format('%010d', tonumber(seq)))
  redis.call('ZREMRANGEBYRANK', idx, 0, -tonumber(ARGV[6]) - 1)
  redis.call('PEXPIRE', idx, ARGV[7])
  redis.call('SET', tag .. ':issue-index-since', id, 'NX')
end
return {released, 1, id}
