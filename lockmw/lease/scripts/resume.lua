-- resume.lua (after pause.lua): one step of a resume. The first step (begin '1') marks
-- the pause resuming: from then on a copy the resume published runs, and every other
-- event of the scope still parks (behind the line: nothing overtakes it). Each step
-- returns the line's head for the caller to append to its stream (once, by its
-- lid@parked_ms@stream: on Redis Cluster the stream is in another slot), and the next
-- step, told it was published, takes it out of the line. A crash between
-- leaves it at the head, and the append's repeat adds nothing. The step that finds the
-- line empty ends the pause, in the same script: no event is parked after the last
-- publish and before the end.
--
-- KEYS: reg, seen (unused: in the pause's slot), line
-- ARGV: name, published (the head appended, or ''), seen_ttl_ms, begin ('1' or '0')
-- Returns {0} no such pause, {1} resumed (the pause is gone), {3} paused again
-- meanwhile (the pause stays; its line too), or {5, published id, stream, field,
-- value, ...} the head to append.
local reg, line = KEYS[1], KEYS[3]
local name = ARGV[1]
local v = redis.call('HGET', reg, name)
if not v then return {0} end
local ok, p = pcall(cjson.decode, v)
if not ok or type(p) ~= 'table' then p = {scope = name} end
if ARGV[4] == '1' then
  p.state = 'resuming'
  redis.call('HSET', reg, name, cjson.encode(p))
end
if p.state ~= 'resuming' then return {3} end
local function head()
  local h = redis.call('ZRANGE', line, 0, 0)[1]
  if not h then return nil, nil end
  local e = cjson.decode(string.sub(h, 14))
  return h, e, e[1] .. '@' .. e[2] .. '@' .. e[4]
end
local h, e, pub = head()
if h and pub == ARGV[2] then
  redis.call('ZREM', line, h)
  h, e, pub = head()
end
if not h then
  redis.call('HDEL', reg, name)
  redis.call('DEL', line)
  return {1}
end
return {5, pub, unpack(e, 4)}
