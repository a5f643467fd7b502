-- line_wake_scoped.lua (after lease.lua, line.lua and line_scoped.lua): line_wake.lua
-- for a shared key's line, whose members may be of several issues (the head's copy is
-- filed under its own issue). Safe at any time, from any worker.
--
-- KEYS: lock, info, fence, line, seen, turn (the shared key's)
-- ARGV: as line_wake.lua's.
-- Returns line_wake.lua's replies; {5, ...} ends with '_issue', the head's issue.
local k = line_keys(KEYS[1], KEYS[2], KEYS[3], 4)
local p = line_promote_scoped(k, {mode = ARGV[1], published = ARGV[2], hold_ms = ARGV[3], seen_ttl = ARGV[4],
  maxlen = ARGV[5], issue = ARGV[6], idx_max = ARGV[7], idx_ttl = ARGV[8]})
if p and p[1] == 5 then return {5, 0, unpack(p, 2)} end
if p then return {0, '', p[2], p[3]} end
return {0, '', '', ''}
