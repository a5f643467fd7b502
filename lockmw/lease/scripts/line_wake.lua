-- line_wake.lua (after lease.lua and line.lua): wakes a line whose wake-up was lost: the
-- key is free, it is nobody's turn (the turn of a run that never finished expired), and
-- events wait. It hands the key to the head exactly as a release does (line_promote),
-- and does nothing in any other state, so it is safe to send at any time, from any
-- worker, as often as wanted.
--
-- KEYS: lock, info, fence, line, seen, turn
-- ARGV: mode, published (lid@joined_ms of the head published), hold_ms, seen_ttl_ms, maxlen, issue, index max, index TTL,
-- then the lids of the key's pending entries earlier than the head (line_blocked, as release_line.lua).
-- Returns {0, '', promoted lid or '', its new id or ''} or {5, 0, lid, field, value, ...}.
local k = line_keys(KEYS[1], KEYS[2], KEYS[3], 4)
local p = line_promote(k, {mode = ARGV[1], published = ARGV[2], hold_ms = ARGV[3], seen_ttl = ARGV[4],
  maxlen = ARGV[5], issue = ARGV[6], idx_max = ARGV[7], idx_ttl = ARGV[8], blocked = line_blocked(k.line, k.seen, 9)})
if p and p[1] == 5 then return {5, 0, unpack(p, 2)} end
if p then return {0, '', p[2], p[3]} end
return {0, '', '', ''}
