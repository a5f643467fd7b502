-- publish: append an entry to a stream unless the issue's queued marker names one still
-- waiting there, and point the marker at the new entry, atomically.
-- KEYS[1] marker, KEYS[2] stream, KEYS[3] the issue's index of the stream, KEYS[4] the
-- stream's index start (xonce.IndexKey, xonce.IndexSinceKey); ARGV[1] group, ARGV[2]
-- marker TTL (ms), ARGV[3] the field holding an entry's message UUID, ARGV[4] index max,
-- ARGV[5] index TTL (ms), ARGV[6..] field, value, ...
-- Returns {0, waiting id} or {1, new id} ({1, id} also for a repeat of the same
-- message, by its UUID).

-- idgt mirrors streamid.Compare (a > b) for full "ms-seq" ids.
local function idgt(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return false end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  if am ~= bm then return am > bm end
  return as > bs
end

-- named says whether the entry at id is the one the marker names: true, false, or nil
-- when no entry has that id. A stream deleted and created again restarts its ids from its
-- first XADD's millisecond, so an entry of the new stream can carry the very id of an
-- entry of the old one; the marker's uuid (the entry's message UUID) tells them apart. A
-- marker without one (written by a producer of downstream requests) names whatever
-- entry has the id.
local function named(stream, id, uuidField, uuid)
  local xs = redis.call('XRANGE', stream, id, id, 'COUNT', 1)
  if #xs == 0 then return nil end
  if not uuid then return true end
  local f = xs[1][2]
  for i = 1, #f, 2 do
    if f[i] == uuidField then return f[i + 1] == uuid end
  end
  return false
end

-- waiting decides whether the entry a queued marker names is still waiting for the
-- group: unread (after the group's last-delivered-id, or the group does not exist yet,
-- which the workers create from id 0) and still in the stream, or pending (delivered,
-- not acked; a pending entry deleted from the stream still counts, its worker has it).
-- A waiting marker's TTL is renewed. The marker is "<entry id> <stream> <uuid>", or
-- "<entry id> <stream>".
local function waiting(marker, group, ttl, uuidField)
  local v = redis.call('GET', marker)
  if not v then return false end
  local id, stream, uuid = string.match(v, '^(%S+) (%S+) (%S+)$')
  if not id then id, stream = string.match(v, '^(%S+) (%S+)$') end
  if not id then return false end
  if redis.call('EXISTS', stream) == 0 then return false end
  local last = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, ld = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end
    end
    if name == group then last = ld end
  end
  local w
  if last == nil or idgt(id, last) then
    w = named(stream, id, uuidField, uuid) == true
  else
    w = #redis.call('XPENDING', stream, group, id, id, 1) > 0 and named(stream, id, uuidField, uuid) ~= false
  end
  if w then redis.call('PEXPIRE', marker, ttl) end
  return w and id, uuid
end

local args = {'XADD', KEYS[2], '*'}
local uuid = nil
for i = 6, #ARGV, 2 do
  table.insert(args, ARGV[i])
  table.insert(args, ARGV[i + 1])
  if ARGV[i] == ARGV[3] then uuid = ARGV[i + 1] end
end
local cur, curUUID = waiting(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if cur then
  -- The waiting entry is this very message: the script ran before and its reply was
  -- lost (go-redis sent it again). Report that publish, not a refusal, so the caller
  -- goes on as after a publish (flips the trigger label).
  if uuid and uuid ~= '' and curUUID == uuid then return {1, cur} end
  return {0, cur}
end
local id = redis.call(unpack(args))
local marker = id .. ' ' .. KEYS[2]
-- A UUID with a space (never one that watermill made) would not parse back: left out.
if uuid and uuid ~= '' and not string.find(uuid, '%s') then marker = marker .. ' ' .. uuid end
redis.call('SET', KEYS[1], marker, 'PX', ARGV[2])
-- The issue's index, as xadd_once.lua keeps it (bounds there).
local ms, seq = string.match(id, '^(%d+)-(%d+)$')
redis.call('ZADD', KEYS[3], ms, ms .. '-' .. string.format('%010d', tonumber(seq)))
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[4]) - 1)
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
if #first > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. string.match(first[1][1], '^(%d+)-'))
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
redis.call('SET', KEYS[4], id, 'NX')
return {1, id}
