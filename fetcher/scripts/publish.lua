-- publish: append an entry to a stream unless the issue's queued marker names one still
-- waiting there, and point the marker at the new entry, atomically.
-- KEYS[1] marker, KEYS[2] stream; ARGV[1] group, ARGV[2] marker TTL (ms), ARGV[3..] field,
-- value, ... Returns {0, waiting id} or {1, new id}.

-- idgt mirrors streamid.Compare (a > b) for full "ms-seq" ids.
local function idgt(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return false end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  if am ~= bm then return am > bm end
  return as > bs
end

-- waiting decides whether the entry a queued marker names is still waiting for the
-- group: unread (after the group's last-delivered-id, or the group does not exist yet,
-- which the workers create from id 0) and still in the stream, or pending (delivered,
-- not acked). A waiting marker's TTL is renewed. The marker is "<entry id> <stream>".
local function waiting(marker, group, ttl)
  local v = redis.call('GET', marker)
  if not v then return false end
  local id, stream = string.match(v, '^(%S+) (%S+)$')
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
    w = #redis.call('XRANGE', stream, id, id, 'COUNT', 1) > 0
  else
    w = #redis.call('XPENDING', stream, group, id, id, 1) > 0
  end
  if w then redis.call('PEXPIRE', marker, ttl) end
  return w and id
end

local cur = waiting(KEYS[1], ARGV[1], ARGV[2])
if cur then return {0, cur} end
local args = {'XADD', KEYS[2], '*'}
for i = 3, #ARGV do table.insert(args, ARGV[i]) end
local id = redis.call(unpack(args))
redis.call('SET', KEYS[1], id .. ' ' .. KEYS[2], 'PX', ARGV[2])
return {1, id}
