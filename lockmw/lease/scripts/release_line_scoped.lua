-- release_line_scoped.lua (after lease.lua, line.lua and line_scoped.lua): the end of a
-- lease that holds a shared key with a line on it (scope issue or group, a wait rule in
-- use), when the agent's own key is in the shared key's hash slot (standalone Redis;
-- scope issue on Cluster), and its hand-over, in one atomic step: release the lease
-- (release in lease.lua), compare-and-delete the shared key, end the event's turn as
-- done says (release_line.lua's), ack its entry (standalone), then hand the shared key
-- to the head of its line (line_promote_scoped: whichever agent or issue the head is
-- of). No event of the line can meet the key free between the release and the
-- hand-over, and exactly one is woken.
--
-- KEYS: lock, info, done, queue, mailbox (the agent's), shared lock, shared info,
-- shared fence, line, seen, turn[, stream]
-- ARGV: as release_line.lua's.
-- Returns release_line.lua's replies; released is 2 when the lease was deleted but the
-- shared key was not ours any more.
local r = release({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}, {token = ARGV[1], outcome = ARGV[2],
  mid = ARGV[3], mode = ARGV[4], maxlen = ARGV[5], published = ARGV[6], issue = ARGV[7],
  idx_max = ARGV[8], idx_ttl = ARGV[9], published_ms = ARGV[10]})
if r[1] == 3 then return r end
if redis.call('GET', KEYS[6]) == ARGV[1] then
  redis.call('DEL', KEYS[6], KEYS[7])
elseif r[1] == 1 then
  r[1] = 2
end
local k = line_keys(KEYS[6], KEYS[7], KEYS[8], 9)
line_end_turn(k, ARGV[11], ARGV[12], ARGV[14])
if #KEYS >= 12 then redis.call('XACK', KEYS[12], ARGV[16], ARGV[17]) end
local p = line_promote_scoped(k, {mode = ARGV[4], published = ARGV[15], hold_ms = ARGV[13], seen_ttl = ARGV[14],
  maxlen = ARGV[5], issue = ARGV[7], idx_max = ARGV[8], idx_ttl = ARGV[9]})
if p and p[1] == 5 then return {5, r[1], unpack(p, 2)} end
local plid, pid = '', ''
if p then plid, pid = p[2], p[3] end
return {r[1], r[3] or '', plid, pid}
