-- acquire_or_deliver is acquire.lua for the deliver policy: when the lease is held, the
-- event becomes a follow-up of the run that holds it, in the same atomic step:
--   1. its follow-up record is appended to the lease's mailbox (a stream in the lease's
--      hash slot), unless the mailbox holds mailbox_max entries already ({3, depth}:
--      nothing changes, the caller dead-letters the event);
--   2. the event is kept as the issue's one queued event (newest wins, as coalesce), so
--      the release that finds follow-ups nobody accounted for starts exactly one next
--      run (release in lease.lua; an empty mailbox then drops it);
--   3. on standalone Redis (the source stream given as KEYS[8]) its stream entry is
--      acked: the ack exists only once the follow-up is in the mailbox.
--
-- The holder's own entry (claimed from its dead worker while the lease lives) is only
-- reported busy: neither appended, queued nor acked.
--
-- A wake-up (n = 0: no follow-up fields) is never appended: see below.
--
-- Safe to repeat: a lock that already holds the token is the lease an earlier try made;
-- an event whose message id is in the seen set (mailbox .. ':seen') was appended by an
-- earlier try whose reply was lost: it is not appended again (dup = 1), only acked.
--
-- An event is superseded exactly as in acquire_or_queue.lua.
--
-- KEYS: lock, info, fence, queue, done, mailbox, seen[, source stream].
-- ARGV: token, ttl_ms, owner, acquired_at_ms, message_id, queue_ttl_ms, target_stream,
-- entry_ms or '', mailbox_max, group, entry_id, n (the number of ARGV after mailbox_ttl_ms
-- that are the follow-up's fields and values), mailbox_ttl_ms, follow-up field, value,
-- ..., then the queued event's field, value, ...
--
-- The mailbox and its seen set live mailbox_ttl_ms from the last append, not the queue's
-- TTL: the event the release republishes for them may wait in a backlog long after the
-- lease is gone, and its run must still find them.
--
-- Returns {1, fence}, {2, released_ms, released_message_id}, {3, depth, owner, fence,
-- acquired_at, message_id, pttl} or {0, owner, fence, acquired_at, message_id, pttl,
-- mailbox_id, depth, dup} (dup: 1 a repeat, or a wake-up queued; 2 a wake-up with
-- nothing left to wake for).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {1, tonumber(redis.call('HGET', KEYS[2], 'fence') or redis.call('GET', KEYS[3]) or 0)}
end
if ARGV[8] ~= '' then
  local d = redis.call('GET', KEYS[5])
  if d then
    local ms, mid, rq = string.match(d, '^(%d+) (%S+) (%d+)')
    local t = redis.call('TIME')
    if rq and tonumber(ARGV[8]) < tonumber(rq) and t[1] * 1000 + math.floor(t[2] / 1000) >= tonumber(rq) then
      return {2, tonumber(rq), mid}
    end
  end
end
if tonumber(ARGV[12]) == 0 and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('XLEN', KEYS[6]) == 0 then
  -- A wake-up that meets a free lease and an empty mailbox: a run took the lease since it
  -- was published and accounted for every follow-up it stood for. Nothing to run: it is
  -- only acked, reported as busy with the run that released last (the done record's
  -- message id) and dup = 2: dropped.
  if #KEYS >= 8 then redis.call('XACK', KEYS[8], ARGV[10], ARGV[11]) end
  local last = string.match(redis.call('GET', KEYS[5]) or '', '^%d+ (%S+)') or ''
  return {0, '', '', '', last, 0, '', 0, 2}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[3], 'fence', fence,
    'acquired_at', ARGV[4], 'message_id', ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {1, fence}
end
local h = redis.call('HMGET', KEYS[2], 'owner', 'fence', 'acquired_at', 'message_id')
local pttl = redis.call('PTTL', KEYS[1])
local n = tonumber(ARGV[12])
local id, dup = '', 0
local depth = redis.call('XLEN', KEYS[6])
if ARGV[5] ~= '' and h[4] == ARGV[5] then
  -- The holder's own entry, claimed by another consumer while the lease lives (its
  -- worker died mid-run): busy, and nothing more. Acked, it would never run again;
  -- left pending, it runs once the lease has expired.
  return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', pttl, '', depth, 0}
end
if n == 0 then
  -- A wake-up (no follow-up of its own: the event a release republished for the
  -- mailbox's follow-ups). They are in the mailbox, or a run accounted for them since:
  -- nothing is appended; it is only kept as the queued event, so the holder's release
  -- starts a next run if follow-ups remain (the release step, lease.lua).
  dup = 1
  redis.call('DEL', KEYS[4])
  local q = {'HSET', KEYS[4], '_stream', ARGV[7], '_qid', ARGV[5], '_mbox', '1'}
  for i = 14, #ARGV do table.insert(q, ARGV[i]) end
  redis.call(unpack(q))
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
elseif redis.call('SISMEMBER', KEYS[7], ARGV[5]) == 1 then
  dup = 1
else
  if depth >= tonumber(ARGV[9]) then
    return {3, depth, h[1] or '', h[2] or '', h[3] or '', h[4] or '', pttl}
  end
  local add = {'XADD', KEYS[6], '*'}
  for i = 14, 13 + n do table.insert(add, ARGV[i]) end
  id = redis.call(unpack(add))
  depth = depth + 1
  redis.call('SADD', KEYS[7], ARGV[5])
  redis.call('PEXPIRE', KEYS[6], ARGV[13])
  redis.call('PEXPIRE', KEYS[7], ARGV[13])
  redis.call('DEL', KEYS[4])
  local q = {'HSET', KEYS[4], '_stream', ARGV[7], '_qid', ARGV[5], '_mbox', '1'}
  for i = 14 + n, #ARGV do table.insert(q, ARGV[i]) end
  redis.call(unpack(q))
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
end
if #KEYS >= 8 then redis.call('XACK', KEYS[8], ARGV[10], ARGV[11]) end
return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', pttl, id, depth, dup}
