package lockmw

import "github.com/redis/go-redis/v9"

// Each script touches only the keys of one lease (one hash slot under KeysCluster) and
// runs atomically, so compare-and-act has no window.

// acquireScript: SET NX PX the token; on success take the next fence and write the
// operator record, all in the one round trip. On conflict return the holder's record so
// the caller can name the holder without a second round trip.
//
// With an entry time (ARGV[6], the ms part of the event's stream id), an event that
// entered its stream before the last release of this lease by another event's run is
// refused as superseded ({2, released_ms, released_message_id}): it waited in a
// consumer's read-ahead buffer while the issue was being worked on, and would have been
// dropped as locked had it been looked at then.
//
// KEYS: lock, info, fence, done. ARGV: token, ttl_ms, owner, acquired_at_ms,
// message_id, entry_ms or ”.
var acquireScript = redis.NewScript(`
if ARGV[6] ~= '' then
  local d = redis.call('GET', KEYS[4])
  if d then
    local ms, mid = string.match(d, '^(%d+) (%S+)')
    if ms and tonumber(ARGV[6]) < tonumber(ms) and mid ~= ARGV[5] then return {2, tonumber(ms), mid} end
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[3], 'fence', fence,
    'acquired_at', ARGV[4], 'message_id', ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {1, fence}
end
local h = redis.call('HMGET', KEYS[2], 'owner', 'fence', 'acquired_at', 'message_id')
return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1])}
`)

// extendScript: compare-and-PEXPIRE of both expiring keys.
//
// KEYS: lock, info. ARGV: token, ttl_ms.
var extendScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
`)

// releaseScript: compare-and-delete. A foreign lease (another token, or a Python
// agent's plain key) is never deleted. A release records when (server time) and for
// which message it happened, for the superseded checks: the done record is
// "<released_ms> <message_id> <last_follow_up_ms>".
//
// KEYS: lock, info, done. ARGV: token.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local mid = redis.call('HGET', KEYS[2], 'message_id')
redis.call('DEL', KEYS[1], KEYS[2])
if mid and mid ~= '' then
  local t = redis.call('TIME')
  local prev = string.match(redis.call('GET', KEYS[3]) or '', '^%d+ %S+ (%d+)') or '0'
  redis.call('SET', KEYS[3], (t[1] * 1000 + math.floor(t[2] / 1000)) .. ' ' .. mid .. ' ' .. prev, 'PX', 86400000)
end
return 1
`)

// forceReleaseScript: the operator's override. It deletes whatever holds the lease and
// bumps the fence so that the evicted holder's fenced writes are refused from now on.
//
// KEYS: lock, info, fence. Returns the new fence.
var forceReleaseScript = redis.NewScript(`
redis.call('DEL', KEYS[1], KEYS[2])
return redis.call('INCR', KEYS[3])
`)

// fencedXAddScript: append to a stream only while the lease is still ours. Standalone
// Redis only (the stream and the lease are in different slots on a cluster).
//
// KEYS: lock, stream. ARGV: token, maxlen (0 = none), field, value, ...
var fencedXAddScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASELOST lease is no longer held')
end
local args = {'XADD', KEYS[2]}
if tonumber(ARGV[2]) > 0 then
  table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[2])
end
table.insert(args, '*')
for i = 3, #ARGV do table.insert(args, ARGV[i]) end
return redis.call(unpack(args))
`)

// acquireOrQueueScript is acquireScript for the coalesce policy: when the lease is held,
// the event is stored as the one queued follow-up (newest wins) in the same
// atomic step, so it cannot slip between a holder's release and its drain.
//
// An event is superseded only if a queued follow-up was published after it entered its
// stream (the done record's third field, kept across releases): that newer follow-up
// stands for it. Otherwise it runs: it is the follow-up nobody queued because it waited
// in a read-ahead buffer.
//
// KEYS: lock, info, fence, queue, done. ARGV: token, ttl_ms, owner, acquired_at_ms,
// message_id, queue_ttl_ms, target_stream, entry_ms or ”, field, value, ...
// Returns {1, fence}, {2, released_ms, released_message_id} or
// {0, owner, fence, acquired_at, message_id, pttl, replaced}.
var acquireOrQueueScript = redis.NewScript(`
if ARGV[8] ~= '' then
  local d = redis.call('GET', KEYS[5])
  if d then
    local ms, mid, rq = string.match(d, '^(%d+) (%S+) (%d+)')
    if rq and tonumber(ARGV[8]) < tonumber(rq) then
      return {2, tonumber(rq), mid}
    end
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[3], 'fence', fence,
    'acquired_at', ARGV[4], 'message_id', ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {1, fence}
end
local replaced = redis.call('DEL', KEYS[4])
local args = {'HSET', KEYS[4], '_stream', ARGV[7]}
for i = 9, #ARGV do table.insert(args, ARGV[i]) end
redis.call(unpack(args))
redis.call('PEXPIRE', KEYS[4], ARGV[6])
local h = redis.call('HMGET', KEYS[2], 'owner', 'fence', 'acquired_at', 'message_id')
return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1]), replaced}
`)

// releaseDrainScript is releaseScript for the coalesce policy: after deleting our lease
// it takes the queued follow-up, if any, and returns it (field, value, ...) for the
// caller to publish; on standalone Redis (ARGV[2] = "1") it appends it to its stream
// itself, so a crash cannot lose it between take and publish.
//
// KEYS: lock, info, queue, done. ARGV: token, inline_xadd, maxlen.
var releaseDrainScript = redis.NewScript(`
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
`)
