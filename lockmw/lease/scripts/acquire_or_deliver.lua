-- acquire_or_deliver.lua (after lease.lua) is acquire.lua for the deliver policy: when the lease is held, the
-- event becomes a follow-up of the run that holds it, in the same atomic step:
--   1. its follow-up record is appended to the lease's mailbox (a stream in the lease's
--      hash slot), unless the mailbox holds mailbox_max entries already ({3, depth}:
--      nothing changes, the caller dead-letters the event);
--   2. the event is kept as the issue's one queued event (newest wins, as coalesce), so
--      the release that finds follow-ups nobody accounted for starts exactly one next
--      run (release in lease.lua; an empty mailbox then drops it).
-- Its caller then writes its record and acks its stream entry, record first: the ack
-- exists only once the follow-up is in the mailbox, and a reply lost past go-redis's
-- retries leaves the entry pending, for a repeat that records and acks it.
--
-- The holder's own entry (claimed from its dead worker while the lease lives) is only
-- reported busy: neither appended nor queued (its caller does not ack it).
--
-- A wake-up (n = 0: no follow-up fields) is never appended: see below.
--
-- Safe to repeat: a lock that already holds the token is the lease an earlier try made;
-- an event whose stream and message id are in the seen set (mailbox .. ':seen', member
-- '<target_stream> <message_id>': a worker reads an agent's stream and its :todo twin,
-- whose entry ids repeat) was appended by an earlier try whose reply was lost: it is not
-- appended again (dup = 1).
--
-- An event is superseded exactly as in acquire_or_queue.lua.
--
-- KEYS: lock, info, fence, queue, done, mailbox, seen, stop.
-- ARGV: token, ttl_ms, owner, acquired_at_ms, message_id, queue_ttl_ms, target_stream,
-- entry_ms or '', mailbox_max, n (the number of ARGV after mailbox_ttl_ms that are the
-- follow-up's fields and values), mailbox_ttl_ms, follow-up field, value, ..., then the
-- queued event's field, value, ...
--
-- The mailbox and its seen set live mailbox_ttl_ms from the last append, not the queue's
-- TTL: the event the release republishes for them may wait in a backlog long after the
-- lease is gone, and its run must still find them.
--
-- Returns {1, fence, stopping} (granted_stopping), {2, released_ms, released_message_id}, {3, depth, owner, fence,
-- acquired_at, message_id, pttl} or {0, owner, fence, acquired_at, message_id, pttl,
-- mailbox_id, depth, dup} (dup: 1 a repeat, or a wake-up queued; 2 a wake-up with
-- nothing left to wake for).
local own = own_repeat(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
if own then return granted_stopping({1, own}, KEYS[8], ARGV[1]) end
local sup = superseded_by_follow_up(KEYS[5], ARGV[8])
if sup then return sup end
if tonumber(ARGV[10]) == 0 and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('XLEN', KEYS[6]) == 0 then
  -- A wake-up that meets a free lease and an empty mailbox: a run took the lease since it
  -- was published and accounted for every follow-up it stood for. Nothing to run: it is
  -- reported as busy with the run that released last (the done record's message id)
  -- and dup = 2: dropped.
  local last = string.match(redis.call('GET', KEYS[5]) or '', '^%d+ (%S+)') or ''
  return {0, '', '', '', last, 0, '', 0, 2}
end
local f = take(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if f then return granted_stopping({1, f}, KEYS[8], ARGV[1]) end
local r = holder_busy(KEYS[1], KEYS[2])
local n = tonumber(ARGV[10])
local id, dup = '', 0
local depth = redis.call('XLEN', KEYS[6])
if ARGV[5] ~= '' and same_entry(r[5], ARGV[5]) then
  -- The holder's own entry, claimed by another consumer while the lease lives (its
  -- worker died mid-run): busy, and nothing more. Acked, it would never run again;
  -- left pending, it runs once the lease has expired.
  return {0, r[2], r[3], r[4], r[5], r[6], '', depth, 0}
end
if n == 0 then
  -- A wake-up (no follow-up of its own: the event a release republished for the
  -- mailbox's follow-ups). They are in the mailbox, or a run accounted for them since:
  -- nothing is appended; it is only kept as the queued event, so the holder's release
  -- starts a next run if follow-ups remain (the release step, lease.lua).
  dup = 1
  redis.call('DEL', KEYS[4])
  local q = {'HSET', KEYS[4], '_stream', ARGV[7], '_qid', entry_id(ARGV[5]), '_mbox', '1'}
  for i = 12, lease_nargs do table.insert(q, ARGV[i]) end
  redis.call(unpack(q))
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
elseif redis.call('SISMEMBER', KEYS[7], ARGV[7] .. ' ' .. entry_id(ARGV[5])) == 1 then
  dup = 1
else
  if depth >= tonumber(ARGV[9]) then
    return holder_refused(KEYS[1], KEYS[2], depth)
  end
  local add = {'XADD', KEYS[6], '*'}
  for i = 12, 11 + n do table.insert(add, ARGV[i]) end
  id = redis.call(unpack(add))
  depth = depth + 1
  redis.call('SADD', KEYS[7], ARGV[7] .. ' ' .. entry_id(ARGV[5]))
  redis.call('PEXPIRE', KEYS[6], ARGV[11])
  redis.call('PEXPIRE', KEYS[7], ARGV[11])
  redis.call('DEL', KEYS[4])
  local q = {'HSET', KEYS[4], '_stream', ARGV[7], '_qid', entry_id(ARGV[5]), '_mbox', '1'}
  for i = 12 + n, lease_nargs do table.insert(q, ARGV[i]) end
  redis.call(unpack(q))
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
end
return {0, r[2], r[3], r[4], r[5], r[6], id, depth, dup}
