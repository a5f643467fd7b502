-- handoff.lua (after lease.lua): the end of an event on standalone Redis, in one atomic
-- step and in this order: release its lease (publishing its queued follow-up, if it has
-- one: see release in lease.lua), XACK its stream entry, and, when the next entry is
-- known, take that entry's lease. One script, so the ack can never come before the
-- release, whatever the server's script cache holds.
--
-- KEYS: lock, info, done, queue, mailbox, stream[, next lock, next info, next fence,
-- next done, next stop].
-- ARGV: token, message_id, group, entry_id, maxlen, issue, index max, index TTL (ms)[,
-- next token, ttl_ms, owner, acquired_at_ms, next message_id, next entry_ms or ''].
-- Returns {released, acked, published follow-up id or ''[, <acquire's reply>...]}, a
-- grant's with the runs still stopping on its key appended (granted_stopping).
local r = release({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}, {token = ARGV[1], outcome = 'ran',
  mid = ARGV[2], mode = '1', maxlen = ARGV[5], published = '', issue = ARGV[6],
  idx_max = ARGV[7], idx_ttl = ARGV[8]})
local acked = redis.call('XACK', KEYS[6], ARGV[3], ARGV[4])
if lease_nkeys < 11 then return {r[1], acked, r[3] or ''} end
local a = granted_stopping(acquire(KEYS[7], KEYS[8], KEYS[9], KEYS[10], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14]),
  KEYS[11], ARGV[9])
return {r[1], acked, r[3] or '', unpack(a)}
