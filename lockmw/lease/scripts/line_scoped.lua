-- line_scoped.lua (after lease.lua and line.lua): the wait policy's line on a shared key
-- (scopes issue and group), put before the scripts that use it
-- (acquire_or_wait_scoped.lua, release_line_scoped.lua, line_wake_scoped.lua). The line
-- lives on the key the event waits on: the shared key, which every run that may hold
-- the event's issue or group takes, whatever its agent; its line, seen and turn are in
-- that key's hash slot (lockline:<scope>@issue:<ISSUE>, lockline:<scope>@group:<KEY>).
-- The agent's own key is taken with the shared key when the event's turn comes. A line
-- on a shared key holds events of several agents (scope issue) or issues (scope group):
-- seen's field 'i:<lid>' names each one's issue, so the copy appended for its turn is
-- filed in the index of its own issue ('a:<lid>': its agent, 'j:<lid>': its last
-- joined_ms).

-- line_head_issue is the issue of the line's head ('' when unknown or no head).
local function line_head_issue(k)
  local _, he = line_head(k.line)
  if not he then return '' end
  return redis.call('HGET', k.seen, 'i:' .. he[1]) or ''
end

-- line_promote_scoped is line_promote for a line whose members may be of several
-- issues: the copy is filed under the head's own issue (o.issue otherwise). Cluster's
-- {5, ...} reply carries it as a last pair '_issue', issue, for the caller's append.
local function line_promote_scoped(k, o)
  local hi = line_head_issue(k)
  if hi ~= '' then o.issue = hi end
  local p = line_promote(k, o)
  if p and p[1] == 5 then
    table.insert(p, '_issue')
    table.insert(p, o.issue or '')
  elseif p and p[1] == 6 then
    -- The reserved key's record names the head's agent and issue, as a held shared
    -- key's does (operators' views filter shared keys by agent).
    local ha = redis.call('HGET', k.seen, 'a:' .. p[2])
    if ha then redis.call('HSET', k.info, 'agent', ha, 'issue', o.issue or '') end
  end
  return p
end

-- line_end_turn ends lid's turn as done says: '1' it ran (recorded: a repeat is acked,
-- not run), '2' it failed (its retry joins the line again), '0' a give-back (the turn
-- stays).
local function line_end_turn(k, lid, done, seen_ttl)
  if done == '0' or lid == '' then return end
  if done == '1' then
    redis.call('HSET', k.seen, lid, 'r')
    redis.call('HDEL', k.seen, 'i:' .. lid, 'j:' .. lid, 'a:' .. lid)
    redis.call('PEXPIRE', k.seen, seen_ttl)
  end
  if redis.call('GET', k.turn) == lid then redis.call('DEL', k.turn) end
end
