-- line.lua (after lease.lua): the wait policy's line, put before the scripts that use it
-- (acquire_or_wait.lua, release_line.lua, line_wake.lua). Every key is in the lease's
-- hash slot:
--   line  a sorted set: the events waiting for the key, in the order of their streams
--         (score: the ms part of the lid; member: its sequence part, zero-padded to
--         12 digits, a space, then a JSON array {lid, joined_ms, '_stream', stream,
--         field, value, ...}): several consumers reading one stream hand its entries
--         to the script in any order, and the line still runs them in stream order;
--   seen  a hash lid -> 'w' (waiting in the line), 'h' (handed the key: its run holds or
--         held it and has not finished), 'r' (ran to its end): a repeat of any of them is
--         acked and not run, not queued twice; and 'x:<entry id> <stream>' -> 1 for each
--         entry the line took (line_took: its caller acks it), never to take the key again;
--   turn  a string: the lid whose turn it is (handed the key, its run not finished),
--         expiring hold_ms after its last heartbeat. While it lives, a free key is that
--         event's alone (its redelivery after a crash or failure runs before the line
--         moves on); nobody else takes it, and no release hands it on.
-- A lid is the id of the stream entry an event first had (its copies carry it: the
-- caller's waited_from, so every copy of one event is one member of the line), a space
-- and that stream (lease.lineMember): a line holds the events of several streams (an
-- agent's and its :todo stream's; several agents' on a shared key), whose ids repeat.

-- line_head is the line's first member and its decoded element, or nil.
local function line_head(line)
  local h = redis.call('ZRANGE', line, 0, 0)[1]
  if not h then return nil, nil end
  return h, cjson.decode(string.sub(h, 14))
end

-- line_now is the server's time in ms.
local function line_now()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- line_take gives the key to lid with token: a new fence, the operator record, the turn.
-- k: lock, info, fence, line, seen, turn. o: token, ttl_ms, owner, acquired_at, mid,
-- lid, hold_ms, seen_ttl.
local function line_take(k, o)
  redis.call('SET', k.lock, o.token, 'PX', o.ttl_ms)
  local f = record(k.info, k.fence, o.token, o.ttl_ms, o.owner, o.acquired_at, o.mid, 'lid', o.lid)
  redis.call('SET', k.turn, o.lid, 'PX', o.hold_ms)
  redis.call('HSET', k.seen, o.lid, 'h')
  redis.call('PEXPIRE', k.seen, o.seen_ttl)
  return f
end

-- line_promote hands the free key to the head of the line: it pops the head, reserves
-- the key for it (lock 'line:<lid>', its turn) and appends its copy to its stream
-- (standalone Redis, here; publish_queued). Nothing to do while the key is held, while
-- it is somebody's turn, or when the line is empty. On Redis Cluster the stream is in
-- another slot: the head is returned untouched ({5, lid, field, value, ...}) for the
-- caller to append (once, by lid@joined_ms) and to call again with published = that; a
-- crash in between leaves it at the head, not lost. Returns nil, {5, lid@joined_ms,
-- field, value, ...} or {6, lid, new id}.
local function line_promote(k, o)
  if o.blocked or redis.call('EXISTS', k.lock) == 1 or redis.call('EXISTS', k.turn) == 1 then return nil end
  local head, e = line_head(k.line)
  if not head then return nil end
  local lid = e[1]
  local q = {}
  for i = 3, #e do q[#q + 1] = e[i] end
  -- Published once per joining (lid and joined_ms: an event whose failed run joins the
  -- line again is published again).
  local pub = lid .. '@' .. e[2]
  if o.mode ~= '1' and o.published ~= pub then return {5, pub, unpack(q)} end
  redis.call('ZREM', k.line, head)
  local res = 'line:' .. lid
  redis.call('SET', k.lock, res, 'PX', o.hold_ms)
  redis.call('HSET', k.info, 'token', res, 'owner', 'line', 'fence', redis.call('GET', k.fence) or 0,
    'acquired_at', line_now(), 'message_id', lid, 'lid', lid)
  redis.call('PEXPIRE', k.info, o.hold_ms)
  redis.call('SET', k.turn, lid, 'PX', o.hold_ms)
  redis.call('HSET', k.seen, lid, 'h')
  redis.call('PEXPIRE', k.seen, o.seen_ttl)
  local id = ''
  if o.mode == '1' then id = publish_queued(q, o) end
  return {6, lid, id}
end

-- line_before reports whether stream id a is earlier than stream id b (false when
-- either is not one). A lid is compared by its id (before the space and its stream).
local function line_before(a, b)
  local ams, aseq = string.match(a or '', '^(%d+)-(%d+)')
  local bms, bseq = string.match(b or '', '^(%d+)-(%d+)')
  if not ams or not bms then return false end
  ams, bms = tonumber(ams), tonumber(bms)
  return ams < bms or (ams == bms and tonumber(aseq) < tonumber(bseq))
end

-- line_entry_acked reports whether the delivered entry (ARGV[12], in group ARGV[11] of
-- KEYS[src], the source stream: standalone Redis only) was acked: the group delivered
-- it and it is no longer pending. Such a delivery is a stale copy of its event, as a
-- failed run's message that its reader hands over again after another copy of the
-- same entry (a second claim) joined the line, which acked it. Run, it would hold the
-- event's turn with nothing pending to bring the event back if its worker died; it is
-- refused as a copy (state 4), and the event's live copy (the one the line publishes
-- when it hands the key over) runs instead. Nearly always the entry is pending: one
-- XPENDING. A check that cannot be made (no such group) refuses nothing.
local function line_entry_acked(src)
  if lease_nkeys < src or ARGV[12] == '' then return false end
  local p = redis.pcall('XPENDING', KEYS[src], ARGV[11], ARGV[12], ARGV[12], 1)
  if type(p) ~= 'table' or p.err or #p > 0 then return false end
  local groups = redis.pcall('XINFO', 'GROUPS', KEYS[src])
  if type(groups) ~= 'table' or groups.err then return false end
  for _, g in ipairs(groups) do
    local f = g -- a map where the server replies so (an embedded Redis), else pairs
    if not g['name'] then
      f = {}
      for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    end
    if f['name'] == ARGV[11] then
      local last = f['last-delivered-id']
      return last ~= nil and not line_before(last, ARGV[12])
    end
  end
  return false
end

-- line_entry names the delivered entry (ARGV[12], of stream ARGV[10]) in seen: by its
-- stream too, as a line holds entries of several streams (a lid's), whose ids repeat.
local function line_entry()
  return 'x:' .. ARGV[12] .. ' ' .. ARGV[10]
end

-- line_took records that the line took the delivered entry (ARGV[12], the entry the
-- caller read): its caller acks it once it has recorded the conflict. Any later
-- delivery of that entry is a stale copy (line_stale). Kept in seen, as
-- 'x:<entry id> <stream>' (line_entry), as long as seen lives.
local function line_took(seen, seen_ttl)
  if ARGV[12] == '' then return end
  redis.call('HSET', seen, line_entry(), 1)
  redis.call('PEXPIRE', seen, seen_ttl)
end

-- line_stale reports whether the delivered entry is a stale copy that must not take
-- the key: one the line took (line_took), or, on standalone Redis, one acked by anyone
-- (line_entry_acked, KEYS[src] the source stream). On Cluster the first is the only
-- check the script can make, and it is atomic with the take: a copy that passed its
-- reader's check (subscriber stillOurs) just before another copy of its entry joined
-- the line is refused here all the same.
local function line_stale(seen, src)
  if ARGV[12] ~= '' and redis.call('HEXISTS', seen, line_entry()) == 1 then return true end
  return line_entry_acked(src)
end

-- line_blocked reports whether an event of the key earlier in the stream than the
-- line's head was delivered but is not in the line: ARGV[from..] are the lids of the
-- key's pending entries the caller found (lease.Locker.earlierPending; delivery is in
-- stream order, so every event earlier than the head was delivered). One that neither
-- waits in the line ('w') nor ran ('r') would run after the head if the key went to the
-- head now: the key is left free instead, and that event's acquire takes it (it is
-- earlier than the head), or joins before the head (its release hands over).
local function line_blocked(line, seen, from)
  local _, he = line_head(line)
  if not he then return false end
  for i = from, #ARGV do
    if line_before(ARGV[i], he[1]) then
      local st = redis.call('HGET', seen, ARGV[i])
      if st ~= 'w' and st ~= 'r' then return true end
    end
  end
  return false
end

-- line_keys names the line's keys from KEYS[from..]: line, seen, turn.
local function line_keys(lock, info, fence, from)
  return {lock = lock, info = info, fence = fence, line = KEYS[from], seen = KEYS[from + 1], turn = KEYS[from + 2]}
end
