-- acquire_or_queue.lua (after lease.lua) is acquire.lua for the coalesce policy: when the lease is held,
-- the event is stored as the issue's one queued follow-up (newest wins) in the same
-- atomic step, so it cannot slip between a holder's release and its drain.
--
-- An event is superseded only if a queued follow-up was published after it entered its
-- stream (the done record's third field, kept across releases): that newer follow-up
-- stands for it. Otherwise it runs: it is the follow-up nobody queued because it waited
-- in a read-ahead buffer.
--
-- KEYS: lock, info, fence, queue, done, stop. ARGV: token, ttl_ms, owner, acquired_at_ms,
-- message_id, queue_ttl_ms, target_stream, entry_ms or '', field, value, ...
-- The queued follow-up carries _qid, the id of the entry it copies: on Redis Cluster
-- its release publishes it once by that id before deleting it (release in lease.lua).
--
-- Returns {1, fence, stopping} (granted_stopping), {2, released_ms, released_message_id} or
-- {0, owner, fence, acquired_at, message_id, pttl, replaced}.
--
-- The holder's own entry (claimed from its dead worker while the lease lives) is only
-- reported busy, never queued.
--
-- Safe to repeat, like acquire in lease.lua: a lock that already holds the token is the
-- lease this script made on a try whose reply was lost.
local own = own_repeat(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
if own then return granted_stopping({1, own}, KEYS[6], ARGV[1]) end
local sup = superseded_by_follow_up(KEYS[5], ARGV[8])
if sup then return sup end
local f = take(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if f then return granted_stopping({1, f}, KEYS[6], ARGV[1]) end
local r = holder_busy(KEYS[1], KEYS[2])
if ARGV[5] ~= '' and same_entry(r[5], ARGV[5]) then
  -- The holder's own entry, claimed by another consumer while the lease lives (its
  -- worker died mid-run): busy, not queued, or it would run twice.
  table.insert(r, 0)
  return r
end
local replaced = redis.call('DEL', KEYS[4])
local args = {'HSET', KEYS[4], '_stream', ARGV[7], '_qid', entry_id(ARGV[5])}
for i = 9, lease_nargs do table.insert(args, ARGV[i]) end
redis.call(unpack(args))
redis.call('PEXPIRE', KEYS[4], ARGV[6])
table.insert(r, replaced)
return r
