-- release_line_shared.lua (after lease.lua, line.lua and line_scoped.lua): the end of a
-- lease's shared key held apart (a group key on Redis Cluster, in another slot than the
-- agent's keys) that has a line, in two calls around release.lua on the agent's keys:
--   phase 'mark' (first): end the event's turn as done says (line_end_turn: a run that
--     finished is recorded as ran before anything else is given up, so its redelivery
--     after a crash from here on is acked, not run again); the key stays held;
--   phase 'release' (after the agent's key is released): compare-and-delete the shared
--     key and hand it to the head of its line (line_promote_scoped), as
--     release_line_scoped.lua does in one step where the keys share a slot. Releasing
--     the agent's key first means a head of the same agent and issue never finds it
--     still held.
-- A crash between the calls leaves the shared key to its TTL, with nobody's turn: the
-- line waker (or the next event for the key) hands it on.
--
-- KEYS: shared lock, shared info, shared fence, line, seen, turn
-- ARGV: token, lid, done ('1', '2' or '0'), hold_ms, seen_ttl_ms, mode, published
-- (lid@joined_ms of the head published), maxlen, issue, index max, index TTL, phase.
-- Returns {1} ('mark'), {ours, '', promoted lid or '', its new id or ''} or
-- {5, ours, lid@joined_ms, field, value, ..., '_issue', issue}.
local k = line_keys(KEYS[1], KEYS[2], KEYS[3], 4)
line_end_turn(k, ARGV[2], ARGV[3], ARGV[5])
if ARGV[12] == 'mark' then return {1} end
local ours = 0
if redis.call('GET', k.lock) == ARGV[1] then
  redis.call('DEL', k.lock, k.info)
  ours = 1
end
local p = line_promote_scoped(k, {mode = ARGV[6], published = ARGV[7], hold_ms = ARGV[4], seen_ttl = ARGV[5],
  maxlen = ARGV[8], issue = ARGV[9], idx_max = ARGV[10], idx_ttl = ARGV[11]})
if p and p[1] == 5 then return {5, ours, unpack(p, 2)} end
if p then return {ours, '', p[2], p[3]} end
return {ours, '', '', ''}
