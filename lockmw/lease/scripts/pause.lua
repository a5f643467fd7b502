-- pause.lua: the pause of a scope (issue 38), put before park.lua and resume.lua. Every
-- key of the pauses of one lease scope (Options.Scope) is in one hash slot
-- ({<scope>pause} on Redis Cluster), so that a park or a resume step is atomic with the
-- registry it reads:
--   reg   a hash: pause scope name -> JSON {scope, reason, by, at, stop_running, state}
--         (state 'paused', or 'resuming' while resume republishes its line);
--   seen  a hash: '<stream> <entry id>' -> 'w': that entry was parked (a repeat of it
--         is acked, not parked twice);
--   line  a sorted set per pause scope: the parked events, in the order of their
--         streams (score: the ms part of the lid; member: its sequence part,
--         zero-padded to 12 digits, a space, then a JSON array {lid, parked_ms,
--         '_stream', stream, field, value, ...}), as the wait policy's line.
-- A lid is the id of the stream entry an event first had: its copies carry it
-- (metadata parked_from).

-- pause_state is the state of the pause name, or nil when there is none.
local function pause_state(reg, name)
  local v = redis.call('HGET', reg, name)
  if not v then return nil end
  local ok, p = pcall(cjson.decode, v)
  if not ok or type(p) ~= 'table' or not p.state then return 'paused' end
  return p.state
end

-- pause_now is the server's time in ms.
local function pause_now()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
