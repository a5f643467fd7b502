-- acquire_or_queue is acquire.lua for the coalesce policy: when the lease is held,
-- the event is stored as the issue's one queued follow-up (newest wins) in the same
-- atomic step, so it cannot slip between a holder's release and its drain.
--
-- An event is superseded only if a queued follow-up was published after it entered its
-- stream (the done record's third field, kept across releases): that newer follow-up
-- stands for it. Otherwise it runs: it is the follow-up nobody queued because it waited
-- in a read-ahead buffer.
--
-- KEYS: lock, info, fence, queue, done. ARGV: token, ttl_ms, owner, acquired_at_ms,
-- message_id, queue_ttl_ms, target_stream, entry_ms or '', field, value, ...
-- The queued follow-up carries _qid, the id of the entry it copies: on Redis Cluster
-- its release publishes it once by that id before deleting it (release in lease.lua).
--
-- Returns {1, fence}, {2, released_ms, released_message_id} or
-- {0, owner, fence, acquired_at, message_id, pttl, replaced}.
--
-- The holder's own entry (claimed from its dead worker while the lease lives) is only
-- reported busy, never queued.
--
-- Safe to repeat, like acquire in lease.lua: a lock that already holds the token is the
-- lease this script made on a try whose reply was lost.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {1, tonumber(redis.call('HGET', KEYS[2], 'fence') or redis.call('GET', KEYS[3]) or 0)}
end
if ARGV[8] ~= '' then
  local d = redis.call('GET', KEYS[5])
  if d then
    local ms, mid, rq = string.match(d, '^(%d+) (%S+) (%d+)')
    local t = redis.call('TIME')
    -- As stepped_back in lease.lua: a clock stepped back since cannot compare.
    if rq and tonumber(ARGV[8]) < tonumber(rq) and t[1] * 1000 + math.floor(t[2] / 1000) >= tonumber(rq) then
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
local h = redis.call('HMGET', KEYS[2], 'owner', 'fence', 'acquired_at', 'message_id')
if ARGV[5] ~= '' and h[4] == ARGV[5] then
  -- The holder's own entry, claimed by another consumer while the lease lives (its
  -- worker died mid-run): busy, not queued, or it would run twice.
  return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1]), 0}
end
local replaced = redis.call('DEL', KEYS[4])
local args = {'HSET', KEYS[4], '_stream', ARGV[7], '_qid', ARGV[5]}
for i = 9, #ARGV do table.insert(args, ARGV[i]) end
redis.call(unpack(args))
redis.call('PEXPIRE', KEYS[4], ARGV[6])
return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1]), replaced}
