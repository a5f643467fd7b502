-- handoff_batch.lua (after lease.lua): the ends of several runs and the starts of the
-- next entries' leases, on standalone Redis, in one atomic step and in this order:
-- each run's release (release in lease.lua, outcome ran: its queued follow-up, if
-- any, is published) followed by the XACK of its entry; then each next entry's lease
-- taken ahead (acquire in lease.lua). The releases come first, so an entry of an
-- issue whose run ends here meets the released key (and its superseded check), as it
-- would one round trip later. The clock is read once: each release is dated by when
-- its run ended (now minus its ago_ms), not by when the batch was sent, so an event
-- that entered the stream after a run ended is never counted as superseded by it.
--
-- With the pause keys (reg, seen: pause.lua), a next whose lease is taken here has its
-- pause check done here too, after its acquire and atomic with it, as Pauses.Check
-- would do it one round trip later: checked (1) when no pause exists at all (reg is
-- empty) and its entry was never parked (seen is not 'w'); else 0, and its worker
-- checks the pauses itself. The registry is read once: nothing in this script writes it.
--
-- KEYS: per end, lock, info, done, queue, mailbox, stream; then per next, lock, info,
-- fence, done, stop; then, optionally, reg and seen.
-- ARGV: ends, nexts, index max, index TTL (ms); per end, token, message_id, group,
-- entry_id, maxlen, issue, ago_ms; per next, token, ttl_ms, owner, acquired_at_ms,
-- message_id, entry_ms or '', then '<stream> <entry id>' or '' (no pause check).
-- Returns, per end, released, acked, published follow-up id or ''; then per next, the
-- length of acquire's reply followed by that reply (a grant's with the runs still
-- stopping on its key appended, as granted_stopping does: the nexts' stop hashes are
-- looked for in one EXISTS), then checked (1 or 0).
--
-- The cost of a batch is mostly its redis.call count (each ≈ 1 µs of server time over
-- the command's own), so the common case is done with calls that serve the whole batch:
-- when no end's key is repeated and no queue waits behind any key an end frees, the
-- ends' locks are read in one MGET, deleted in one DEL and their entries acked in one
-- XACK per stream and group (acked is then that XACK's count divided out: 1 when all its
-- entries were pending); the nexts' done records are read in one MGET, after the
-- releases (a release here writes the done record a next of its issue must meet).
-- Otherwise each end goes through release() one by one, as it always did.
local ends, nexts = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local pk = ends * 6 + nexts * 5 -- the pause keys, if given, follow the nexts'
local paused -- whether any pause exists, read at the first check
local dones = {} -- the nexts' done records, read once for all after the releases
local out = {}

-- ended_at is when the run of the end whose arguments start after ARGV[a] ended: the
-- batch's clock minus the time since then.
local function ended_at(a)
  return now - tonumber(ARGV[a + 7])
end

-- release_all is the common case of the ends' releases, in calls that serve them all;
-- false (nothing written) when an end's key repeats or a queue waits behind a key that
-- an end holds or finds free: release() then takes each end in turn.
local function release_all()
  if ends == 0 then return true end
  local locks, seen = {}, {}
  for i = 0, ends - 1 do
    local lock = KEYS[i * 6 + 1]
    if seen[lock] then return false end
    seen[lock] = true
    locks[i + 1] = lock
  end
  local cur = redis.call('MGET', unpack(locks))
  local queues, gone = {}, {}
  for i = 0, ends - 1 do
    local k, a = i * 6, 4 + i * 7
    if cur[i + 1] == ARGV[a + 1] then
      table.insert(gone, KEYS[k + 1])
      table.insert(gone, KEYS[k + 2])
    end
    if cur[i + 1] == ARGV[a + 1] or not cur[i + 1] then queues[#queues + 1] = KEYS[k + 4] end
  end
  if #queues > 0 and redis.call('EXISTS', unpack(queues)) > 0 then return false end
  if #gone > 0 then redis.call('DEL', unpack(gone)) end
  local acks = {} -- per stream and group, the command and its entries' places in out
  for i = 0, ends - 1 do
    local k, a = i * 6, 4 + i * 7
    local mine = cur[i + 1] == ARGV[a + 1]
    if mine and ARGV[a + 2] ~= '' then
      record_done(KEYS[k + 3], ended_at(a), ARGV[a + 2], false)
    end
    local sg = KEYS[k + 6] .. '\0' .. ARGV[a + 3]
    if not acks[sg] then acks[sg] = {cmd = {'XACK', KEYS[k + 6], ARGV[a + 3]}, at = {}} end
    table.insert(acks[sg].cmd, ARGV[a + 4])
    table.insert(out, mine and 1 or 0)
    table.insert(out, 0)
    table.insert(acks[sg].at, #out)
    table.insert(out, '')
  end
  for _, x in pairs(acks) do
    local n = redis.call(unpack(x.cmd))
    for _, at in ipairs(x.at) do out[at] = n == #x.at and 1 or 0 end
  end
  return true
end

if not release_all() then
  for i = 0, ends - 1 do
    local k, a = i * 6, 4 + i * 7
    local r = release({KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]}, {token = ARGV[a + 1],
      outcome = 'ran', mid = ARGV[a + 2], mode = '1', maxlen = ARGV[a + 5], published = '', issue = ARGV[a + 6],
      idx_max = ARGV[3], idx_ttl = ARGV[4], now = ended_at(a)})
    out[#out + 1] = r[1]
    out[#out + 1] = redis.call('XACK', KEYS[k + 6], ARGV[a + 3], ARGV[a + 4])
    out[#out + 1] = r[3] or ''
  end
end

for j = 0, nexts - 1 do dones[j + 1] = KEYS[ends * 6 + j * 5 + 4] end
if nexts > 0 then dones = redis.call('MGET', unpack(dones)) end
local rs, stops = {}, {}
for j = 0, nexts - 1 do
  local k, a = ends * 6 + j * 5, 4 + ends * 7 + j * 7
  rs[j + 1] = acquire(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], nil, nil, nil, dones[j + 1])
  if rs[j + 1][1] == 1 then stops[#stops + 1] = KEYS[k + 5] end
end
-- A stop hash exists only while a superseded run may still be running: nearly never.
local anystop = #stops > 0 and redis.call('EXISTS', unpack(stops)) > 0
for j = 0, nexts - 1 do
  local k, a = ends * 6 + j * 5, 4 + ends * 7 + j * 7
  local r = rs[j + 1]
  if r[1] == 1 then table.insert(r, anystop and stopping(KEYS[k + 5], ARGV[a + 1]) or 0) end
  out[#out + 1] = #r
  for _, v in ipairs(r) do out[#out + 1] = v end
  local checked = 0
  if r[1] == 1 and ARGV[a + 7] ~= '' and #KEYS >= pk + 2 then
    if paused == nil then paused = redis.call('EXISTS', KEYS[pk + 1]) == 1 end
    if not paused and redis.call('HGET', KEYS[pk + 2], ARGV[a + 7]) ~= 'w' then checked = 1 end
  end
  out[#out + 1] = checked
end
return out
