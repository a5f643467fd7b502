-- handoff.lua (after lease.lua): the end of an event on standalone Redis, in one atomic
-- step and in this order: release its lease, XACK its stream entry, and, when the next
-- entry is known, take that entry's lease. One script, so the ack can never come
-- before the release, whatever the server's script cache holds.
--
-- KEYS: lock, info, done, stream[, next lock, next info, next fence, next done].
-- ARGV: token, message_id, group, entry_id[, next token, ttl_ms, owner,
-- acquired_at_ms, next message_id, next entry_ms or ''].
-- Returns {released, acked} or {released, acked, <acquire's reply>...}.
local released = release(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
local acked = redis.call('XACK', KEYS[4], ARGV[3], ARGV[4])
if #KEYS < 8 then return {released, acked} end
local r = acquire(KEYS[5], KEYS[6], KEYS[7], KEYS[8], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
return {released, acked, unpack(r)}
