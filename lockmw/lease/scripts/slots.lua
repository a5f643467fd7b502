-- slots.lua (after lease.lua): concurrency limits with a fair line (slots.go). One limit
-- key (an agent's "at most N runs at once", or one value of an event field's) has these
-- keys, all in one hash slot ({<scope><limit key>}):
--   holders  a sorted set: the holders of its slots, member a run's slot token or
--            'w:<lid>' (a slot handed to a waiter whose copy is on its way), score the
--            server time (ms) at which it frees by itself: a run's renewed with its
--            lease's heartbeat (TTL), a hand-over's after hold_ms. A holder past it is
--            dropped by every script before it counts (a dead holder's slot frees when
--            its lease would have expired);
--   wait1    a sorted set: the priority lane (events from a :todo stream), member lid,
--            score its virtual finish tag;
--   wait2    the same for the batch lane; the priority lane is always served first;
--   recs     a hash lid -> the waiting event, JSON {lid, joined_ms, issue, '_stream',
--            stream, field, value, ...}: what is appended again when its turn comes;
--   meta     a hash: 'limit' (the last N a take named), 'vt<lane>' (the lane's virtual
--            time: the tag served last) and 'f<lane>:<value>' (the last tag given to a
--            value of the fairness field);
--   handed   a hash lid -> record (Redis Cluster only): a waiter handed a slot whose copy
--            the caller has still to append (its stream is in another slot); the caller
--            deletes the field once it appended it, the waker appends what a crash left.
-- Fairness is weighted fair queueing: an event of value v waiting in lane l gets the tag
-- max(vt<l>, f<l>:v) + 1/weight, and the lowest tag goes first: the values take turns
-- (weighted round-robin) however many events one of them floods in, and a value that
-- was quiet starts at the lane's virtual time, not behind the flood.

-- slots_now is the server's time in ms: every time compared here is the server's, so a
-- worker's clock offset moves nothing.
local function slots_now()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- slots_keys names one limit key's keys from KEYS[from..]: holders, wait1, wait2, recs,
-- meta, handed.
local function slots_keys(from)
  return {holders = KEYS[from], wait = {KEYS[from + 1], KEYS[from + 2]}, recs = KEYS[from + 3],
    meta = KEYS[from + 4], handed = KEYS[from + 5]}
end

-- slots_used drops the holders past their time and returns how many remain.
local function slots_used(k, now)
  redis.call('ZREMRANGEBYSCORE', k.holders, '-inf', now)
  return redis.call('ZCARD', k.holders)
end

-- slots_waiting is how many events wait, both lanes.
local function slots_waiting(k)
  return redis.call('ZCARD', k.wait[1]) + redis.call('ZCARD', k.wait[2])
end

-- slots_publish appends a handed waiter's copy (rec, its record) to its stream on
-- standalone Redis (publish_queued: in this script, so no crash strands it), or keeps it
-- in handed for the caller to append (Cluster). Returns the record.
local function slots_publish(k, o, lid, rec)
  local e = cjson.decode(rec)
  if o.mode == '1' then
    local q = {}
    for i = 4, #e do q[#q + 1] = e[i] end
    publish_queued(q, {maxlen = o.maxlen, issue = e[3], idx_max = o.idx_max, idx_ttl = o.idx_ttl})
  else
    redis.call('HSET', k.handed, lid, rec)
    redis.call('PEXPIRE', k.handed, o.seen_ttl)
  end
  return rec
end

-- slots_promote hands every free slot to the next waiter, the priority lane first, the
-- lowest tag of the lane first: the slot is the waiter's ('w:<lid>', for hold_ms) and
-- its copy is appended (slots_publish). The waiter self (the caller's own event, parked
-- just before) is given the slot under token at once instead. Returns the records
-- handed, and whether self took a slot.
local function slots_promote(k, o, now, self, token)
  local out, took = {}, false
  local limit = tonumber(o.limit)
  while redis.call('ZCARD', k.holders) < limit do
    local lane = 1
    if redis.call('ZCARD', k.wait[1]) == 0 then lane = 2 end
    local p = redis.call('ZPOPMIN', k.wait[lane])
    if #p == 0 then break end
    local lid = p[1]
    redis.call('HSET', k.meta, 'vt' .. lane, p[2])
    local rec = redis.call('HGET', k.recs, lid)
    redis.call('HDEL', k.recs, lid)
    if lid == self then
      redis.call('ZADD', k.holders, now + tonumber(o.ttl_ms), token)
      took = true
    elseif rec then
      redis.call('ZADD', k.holders, now + tonumber(o.hold_ms), 'w:' .. lid)
      out[#out + 1] = slots_publish(k, o, lid, rec)
    end
  end
  return out, took
end

-- slots_park puts the event in its lane at its fair place and returns its place among
-- the waiters (1 the next).
local function slots_park(k, o, now)
  local lane = tonumber(o.lane)
  local vt = tonumber(redis.call('HGET', k.meta, 'vt' .. lane) or '0')
  local fk = 'f' .. lane .. ':' .. o.fair
  local last = tonumber(redis.call('HGET', k.meta, fk) or '0')
  local tag = math.max(vt, last) + 1 / math.max(tonumber(o.weight), 1)
  redis.call('HSET', k.meta, fk, tag, 'limit', o.limit)
  redis.call('ZADD', k.wait[lane], tag, o.lid)
  redis.call('HSET', k.recs, o.lid, o.rec)
  for _, key in ipairs({k.wait[1], k.wait[2], k.recs, k.meta}) do redis.call('PEXPIRE', key, o.seen_ttl) end
  local pos = redis.call('ZRANK', k.wait[lane], o.lid) + 1
  if lane == 2 then pos = pos + redis.call('ZCARD', k.wait[1]) end
  return pos
end
