-- acquire_or_wait.lua (after lease.lua and line.lua): acquire for the wait policy. The
-- event takes the key when it is its turn; when the key is busy it joins the key's line
-- in this same script: no release can come between "busy" and "in the line" (the lost
-- wake-up of a separate park step).
--
-- The caller acks the entry of every reply but a grant and state 0, after writing its
-- record (record before ack: a reply lost past go-redis's retries leaves the entry
-- pending, and its redelivery, a repeat, gets the record written). The script remembers
-- each such entry as taken by the line (line_took), so that no later delivery of it,
-- a stale copy, takes the key (line_stale), on either key format.
--
-- Its turn, in this order:
--   1. the lock holds token: the lease an earlier try made (a lost reply);
--   2. seen says it ran to its end ('r'): a repeat, not run ({0, ..., state 3});
--   3. the key is reserved for it ('line:<lid>', a release handed it over), or free and
--      the turn is its own (its run did not finish: a crash, a failure), or free with
--      no turn and it heads the line (its copy came before the release's second call on
--      Cluster), or free with no turn and an empty line: it takes the key, unless its
--      entry is a stale copy (line_stale: state 4);
--   4. otherwise it waits: joins the line at its stream position (unless seen says it waits, or holds the turn:
--      a repeat, only taken; one that held a turn that expired joins again), or, with max events waiting, is refused ({3, depth, ...}:
--      the caller dead-letters it). A free key with nobody's turn and a line is a line
--      whose wake-up was lost (a crash between a release and its publish on Cluster):
--      the reply says so (stranded) and the caller wakes it (line_wake.lua).
-- The holder's own entry (claimed from its dead worker while the lease lives) is only
-- reported busy (state 0), as in acquire_or_queue.lua. An event whose turn it is but
-- whose free key an event of another policy (drop, delay) took joins the line.
--
-- KEYS: lock, info, fence, line, seen, turn, stop[, source stream (standalone Redis: for
-- line_entry_acked)]
-- ARGV: token, ttl_ms, owner, acquired_at_ms, message_id, lid, hold_ms, max, seen_ttl_ms,
-- target_stream, group, entry_id, field, value, ...
-- Returns {1, fence, stopping} (granted_stopping), {3, depth, owner, fence, acquired_at, message_id, pttl} or
-- {0, owner, fence, acquired_at, message_id, pttl, state, position, oldest_ms, stranded}:
-- state 0 the holder's own entry (nothing done), 1 joined, 2 waiting already, 3 ran
-- already, 4 holding already (a copy of the running event); position is its place in
-- the line (1 the head), oldest_ms when the head joined.
local o = {token = ARGV[1], ttl_ms = ARGV[2], owner = ARGV[3], acquired_at = ARGV[4], mid = ARGV[5],
  lid = ARGV[6], hold_ms = ARGV[7], seen_ttl = ARGV[9]}
local k = line_keys(KEYS[1], KEYS[2], KEYS[3], 4)
local own, cur = own_repeat(k.lock, k.info, k.fence, o.token)
if own then return granted_stopping({1, own}, KEYS[7], o.token) end
local state = redis.call('HGET', k.seen, o.lid)
local function busy(st, pos)
  local r = holder_busy(k.lock, k.info)
  local oldest = 0
  local head, he = line_head(k.line)
  if head then oldest = he[2] end
  local stranded = 0
  if not cur and redis.call('EXISTS', k.turn) == 0 and head then stranded = 1 end
  for _, v in ipairs({st, pos, oldest, stranded}) do table.insert(r, v) end
  return r
end
if state == 'r' then
  line_took(k.seen, o.seen_ttl)
  return busy(3, 0)
end
local turn = redis.call('GET', k.turn)
local head, he = line_head(k.line)
local headlid = he and he[1]
-- An event earlier in the stream than the head (delivered before the head joined, not
-- in the line: a release left the key free for it, line_blocked) takes a free key too.
if cur == 'line:' .. o.lid or (not cur and (turn == o.lid or (not turn and (not head or headlid == o.lid or line_before(o.lid, headlid))))) then
  if line_stale(k.seen, 8) then return busy(4, 0) end
  if headlid == o.lid then redis.call('ZREM', k.line, head) end
  return granted_stopping({1, line_take(k, o)}, KEYS[7], o.token)
end
if cur and o.mid ~= '' and holds_entry(k.info, o.mid) then
  return busy(0, 0)
end
-- join puts the event in the line at its stream position and returns its place (1 the
-- head).
local function join()
  local e = {o.lid, line_now(), '_stream', ARGV[10]}
  for i = 13, lease_nargs do e[#e + 1] = ARGV[i] end
  local ms, seq = string.match(o.lid, '^(%d+)-(%d+)') -- the lid's id, before its stream
  if not ms then ms, seq = line_now(), 0 end
  local member = string.format('%012d', tonumber(seq)) .. ' ' .. cjson.encode(e)
  redis.call('ZADD', k.line, ms, member)
  redis.call('PEXPIRE', k.line, o.seen_ttl)
  redis.call('HSET', k.seen, o.lid, 'w')
  redis.call('PEXPIRE', k.seen, o.seen_ttl)
  line_took(k.seen, o.seen_ttl)
  return redis.call('ZRANK', k.line, member) + 1
end
if state == 'h' and turn == o.lid and redis.call('HGET', k.info, 'lid') ~= o.lid then
  -- Its turn, but an event of another policy (drop, delay) took the free key meanwhile:
  -- it joins the line (at its stream position) and gives the turn up, so that holder's
  -- release hands the key to the line.
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
  return holder_refused(k.lock, k.info, n)
end
return busy(1, join())
