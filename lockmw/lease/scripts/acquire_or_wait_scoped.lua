-- acquire_or_wait_scoped.lua (after lease.lua, line.lua and line_scoped.lua): acquire for
-- the wait policy of a lease that holds a shared key (scope issue or group), when the
-- agent's own key is in the shared key's hash slot (standalone Redis; scope issue on
-- Cluster). The line is the shared key's: the key the event waits on, whichever agent
-- or issue holds it. The steps are acquire_or_wait.lua's, on the shared key, and the
-- event's turn takes the agent's own key with it, all or nothing:
--   1. the agent's key holds token: the lease an earlier try made (a lost reply);
--   2. seen says it ran ('r'): a repeat, not run (state 3);
--   3. its turn on the shared key (reserved for it, its own turn, or free with no turn
--      and it heads the line, is earlier in the stream than its head, or the line is
--      empty) and the agent's key free: it takes both (two fences), unless its entry is
--      a stale copy (line_stale: state 4);
--   4. its turn on the shared key but the agent's own key held (a plain lock of a
--      Python agent, or a run of its agent on the issue under another group key): it
--      waits in the shared key's line, which it does not jump, and gives its turn up
--      (the key stays free with the line: nobody is woken now, the line waker or the
--      next event for the key wakes it; never in a loop of copies);
--   5. otherwise it waits (joins the line at its stream position), or, with max
--      events waiting, is refused ({3, depth, ...}).
--
-- On Redis Cluster a group key is in another slot than the agent's key (apart): the
-- caller takes the agent's key first, by a script of its own, and says how that went
-- (apart '1': held with token; '0': busy); this script then has the shared key's keys
-- alone, and its reply's agent fence is 0 (the caller has it). The caller gives the
-- agent's key back when this does not answer {1, ...}.
--
-- KEYS: lock, info, fence (the agent's; not when apart), shared lock, shared info, shared
-- fence, line, seen, turn (the shared key's), stop (the agent's; not when apart)[, source
-- stream (standalone)]
-- ARGV: token, ttl_ms, owner, acquired_at_ms, message_id, lid, hold_ms, max, seen_ttl_ms,
-- target_stream, group, entry_id, agent, issue, apart ('' when the agent's keys are
-- here, '1' or '0'), field, value, ...
-- Returns {1, fence, shared fence[, stopping]} (stopping: granted_stopping, on the agent's
-- key; not when apart, where the caller's own acquire reports it), {3, depth, owner, fence, acquired_at, message_id,
-- pttl} or {0, owner, fence, acquired_at, message_id, pttl, state, position, oldest_ms,
-- stranded, holder agent, holder lock key, holder issue} (states as acquire_or_wait.lua's;
-- the holder is the shared key's, or the agent key's when the shared key is free).
local o = {token = ARGV[1], ttl_ms = ARGV[2], owner = ARGV[3], acquired_at = ARGV[4], mid = ARGV[5],
  lid = ARGV[6], hold_ms = ARGV[7], seen_ttl = ARGV[9], agent = ARGV[13], issue = ARGV[14]}
local apart = ARGV[15]
local a, k, own, acur, src
if apart == '' then
  a = {lock = KEYS[1], info = KEYS[2], fence = KEYS[3], stop = KEYS[10]}
  k = line_keys(KEYS[4], KEYS[5], KEYS[6], 7)
  own, acur = own_repeat(a.lock, a.info, a.fence, o.token)
  if own then return granted_stopping({1, own, held_fence(k.info, k.fence)}, a.stop, o.token) end
  src = 11
else
  k = line_keys(KEYS[1], KEYS[2], KEYS[3], 4)
  if redis.call('GET', k.lock) == o.token then return {1, 0, held_fence(k.info, k.fence)} end
  if apart == '0' then acur = 'held' end
  src = 7
end
local cur = redis.call('GET', k.lock)
local state = redis.call('HGET', k.seen, o.lid)
-- holder names the busy key: the shared one when held, else the agent's.
local function holder()
  if cur or not a then
    local h = redis.call('HMGET', k.info, 'agent', 'issue')
    return k.lock, k.info, h[1] or '', h[2] or ''
  end
  return a.lock, a.info, o.agent, o.issue
end
local function busy(st, pos, stuck)
  local lock, info, hagent, hissue = holder()
  local r = holder_busy(lock, info)
  local oldest = 0
  local head, he = line_head(k.line)
  if head then oldest = he[2] end
  local stranded = 0
  if not stuck and not cur and redis.call('EXISTS', k.turn) == 0 and head then stranded = 1 end
  for _, v in ipairs({st, pos, oldest, stranded, hagent, lock, hissue}) do table.insert(r, v) end
  return r
end
if state == 'r' then
  line_took(k.seen, o.seen_ttl)
  return busy(3, 0)
end
local turn = redis.call('GET', k.turn)
local head, he = line_head(k.line)
local headlid = he and he[1]
-- join puts the event in the line at its stream position and returns its place.
local function join()
  -- Each joining of one event gets its own joined_ms (one ms after its last at least):
  -- lid@joined_ms names the copy appended for it on Cluster, once, and an event that
  -- gave its turn up to a held agent key joins again at once.
  local joined = line_now()
  local last = tonumber(redis.call('HGET', k.seen, 'j:' .. o.lid) or 0)
  if joined <= last then joined = last + 1 end
  local e = {o.lid, joined, '_stream', ARGV[10]}
  for i = 16, lease_nargs do e[#e + 1] = ARGV[i] end
  local ms, seq = string.match(o.lid, '^(%d+)-(%d+)') -- the lid's id, before its stream
  if not ms then ms, seq = line_now(), 0 end
  local member = string.format('%012d', tonumber(seq)) .. ' ' .. cjson.encode(e)
  redis.call('ZADD', k.line, ms, member)
  redis.call('PEXPIRE', k.line, o.seen_ttl)
  redis.call('HSET', k.seen, o.lid, 'w', 'i:' .. o.lid, o.issue, 'a:' .. o.lid, o.agent, 'j:' .. o.lid, joined)
  redis.call('PEXPIRE', k.seen, o.seen_ttl)
  line_took(k.seen, o.seen_ttl)
  return redis.call('ZRANK', k.line, member) + 1
end
-- An event earlier in the stream than the head (not in the line: its turn expired, or
-- it was delivered before the head joined) takes a free key with nobody's turn too, as
-- in acquire_or_wait.lua: were it to join, it would head the line, and a repeat of this
-- call after a lost reply would take the key with its entry taken by the joining (a
-- crash of that run would then leave nothing pending to bring it back).
local mine = cur == 'line:' .. o.lid or (not cur and (turn == o.lid or
  (not turn and (not head or headlid == o.lid or line_before(o.lid, headlid)))))
if mine and not acur then
  if line_stale(k.seen, src) then return busy(4, 0) end
  if headlid == o.lid then redis.call('ZREM', k.line, head) end
  redis.call('SET', k.lock, o.token, 'PX', o.ttl_ms)
  local sf = record(k.info, k.fence, o.token, o.ttl_ms, o.owner, o.acquired_at, o.mid, 'lid', o.lid,
    'agent', o.agent, 'issue', o.issue)
  redis.call('SET', k.turn, o.lid, 'PX', o.hold_ms)
  redis.call('HSET', k.seen, o.lid, 'h', 'i:' .. o.lid, o.issue)
  redis.call('PEXPIRE', k.seen, o.seen_ttl)
  if not a then return {1, 0, sf} end
  redis.call('SET', a.lock, o.token, 'PX', o.ttl_ms)
  local f = record(a.info, a.fence, o.token, o.ttl_ms, o.owner, o.acquired_at, o.mid, 'lid', o.lid)
  return granted_stopping({1, f, sf}, a.stop, o.token)
end
if o.mid ~= '' and ((cur and holds_entry(k.info, o.mid)) or (acur and a and holds_entry(a.info, o.mid))) then
  return busy(0, 0)
end
if mine then
  -- Its turn, but its agent's own key is held: it waits in the line, at its stream
  -- position, and gives the shared key's turn up (not handed on: the head is itself).
  if cur == 'line:' .. o.lid then redis.call('DEL', k.lock, k.info) end
  if turn == o.lid then redis.call('DEL', k.turn) end
  cur = nil
  if headlid == o.lid then
    line_took(k.seen, o.seen_ttl)
    return busy(2, 1, true)
  end
  return busy(1, join(), true)
end
if state == 'h' and turn == o.lid and redis.call('HGET', k.info, 'lid') ~= o.lid then
  -- Its turn, but an event of another policy took the free key meanwhile.
  redis.call('DEL', k.turn)
  return busy(1, join())
end
if state == 'w' or (state == 'h' and turn == o.lid) then
  line_took(k.seen, o.seen_ttl)
  local st = 2
  if state == 'h' then st = 4 end
  return busy(st, 0)
end
local n = redis.call('ZCARD', k.line)
if n >= tonumber(ARGV[8]) then
  local lock, info = holder()
  return holder_refused(lock, info, n)
end
return busy(1, join())
