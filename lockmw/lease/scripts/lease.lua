-- lease.lua (after internal/xonce/index.lua): the steps of the lease, put before the
-- scripts that use them (acquire.lua, release.lua, handoff.lua, ...) so that each step
-- is written once.

-- lease_nkeys and lease_nargs are how many of KEYS and ARGV are the lease script's own:
-- all of them, unless a step after this file takes some off the end for itself (a
-- combined acquire's or release's slots, slots_lease.lua); the steps that walk to the
-- end of KEYS or ARGV stop there.
local lease_nkeys, lease_nargs = #KEYS, #ARGV

-- stepped_back reports whether the server's clock now reads earlier than ms, a time
-- it recorded: it was stepped back since (an NTP step, a failover to a server whose
-- clock is behind). Stream ids are not stepped back with it (they never decrease), so
-- an entry id and a recorded time cannot be compared until the clock has caught up,
-- and the superseded check is skipped: the event runs (the lease still excludes any
-- overlap) rather than being dropped for a run that may have ended before it entered.
local function stepped_back(ms)
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000) < tonumber(ms)
end

-- The acquire step, written once: lease.lua's acquire (acquire.lua, acquire_scoped.lua)
-- and every policy's acquire (acquire_or_queue.lua, acquire_or_deliver.lua,
-- acquire_or_wait.lua, acquire_or_supersede.lua) are built from these sub-steps, each
-- policy keeping only what is its own.

-- held_fence is the fence of a key (info, fence) that already holds the caller's token:
-- the repeat of an acquire whose reply was lost.
local function held_fence(info, fence)
  return tonumber(redis.call('HGET', info, 'fence') or redis.call('GET', fence) or 0)
end

-- own_repeat: an acquire is safe to repeat. When the lock already holds token (go-redis
-- sent the script again after the first try's reply was lost), it returns the fence of
-- the lease that try made, instead of reporting the key locked by its own holder.
-- Returns that fence (nil when the lock does not hold token) and the lock's value.
local function own_repeat(lock, info, fence, token)
  local cur = redis.call('GET', lock)
  if cur ~= token then return nil, cur end
  return held_fence(info, fence), cur
end

-- An event's entry is named by its id and, when the caller knows it, its stream:
-- '<id> <stream>' (a worker reads an agent's stream and its :todo twin, whose entry ids
-- repeat). The lease's record keeps them apart: message_id (the id, as operators and the
-- done record know it) and stream. split_entry returns both ('' when it names none),
-- entry_id the id alone.
local function split_entry(e)
  local id, stream = string.match(e, '^(%S+) (.+)$')
  if id then return id, stream end
  return e, ''
end

local function entry_id(e)
  return (split_entry(e))
end

-- same_entry reports whether a and b name one entry: by id and stream, or by id alone
-- when either does not name its stream (a record written before records named it, a
-- caller that does not know it).
local function same_entry(a, b)
  if a == b then return true end
  local ia = string.match(a, '^(%S+) ')
  local ib = string.match(b, '^(%S+) ')
  if ia and ib then return false end
  return (ia or a) == (ib or b)
end

-- holder_entry is the entry a lease's record (info) names, with its stream if it has one.
local function holder_entry(message_id, stream)
  if not message_id then return '' end
  if stream and stream ~= '' and not string.find(message_id, ' ', 1, true) then
    return message_id .. ' ' .. stream
  end
  return message_id
end

-- holds_entry reports whether the lease record info names entry e (same_entry).
local function holds_entry(info, e)
  local h = redis.call('HMGET', info, 'message_id', 'stream')
  return h[1] ~= false and same_entry(holder_entry(h[1], h[2]), e)
end

-- record takes the next fence and writes the operator record of the lease token now
-- holds (the caller has set the lock), with the given extra fields; it expires with
-- the lease. message_id names the entry, with its stream or not. Returns the fence.
local function record(info, fence, token, ttl_ms, owner, acquired_at_ms, message_id, ...)
  local f = redis.call('INCR', fence)
  local id, stream = split_entry(message_id)
  redis.call('HSET', info, 'token', token, 'owner', owner, 'fence', f,
    'acquired_at', acquired_at_ms, 'message_id', id, 'stream', stream, ...)
  redis.call('PEXPIRE', info, ttl_ms)
  return f
end

-- take: SET NX PX the token; on success the next fence and the operator record, in the
-- same step. Returns the fence, or nil when the lock is held.
local function take(lock, info, fence, token, ttl_ms, owner, acquired_at_ms, message_id)
  if not redis.call('SET', lock, token, 'NX', 'PX', ttl_ms) then return nil end
  return record(info, fence, token, ttl_ms, owner, acquired_at_ms, message_id)
end

-- holder_busy is the busy reply, {0, owner, fence, acquired_at, message_id, pttl}, from
-- the holder's record, so the caller can name the holder without a second round trip;
-- message_id names the holder's stream too when the record does (holder_entry). A
-- policy appends its own fields.
local function holder_busy(lock, info)
  local h = redis.call('HMGET', info, 'owner', 'fence', 'acquired_at', 'message_id', 'stream')
  return {0, h[1] or '', h[2] or '', h[3] or '', holder_entry(h[4], h[5]), redis.call('PTTL', lock)}
end

-- holder_refused is the reply of a policy that refuses an event because depth events
-- wait already: {3, depth, owner, fence, acquired_at, message_id, pttl}.
local function holder_refused(lock, info, depth)
  local r = holder_busy(lock, info)
  r[1] = 3
  table.insert(r, 2, depth)
  return r
end

-- superseded_by_release: with an entry time (entry_ms, the ms part of the event's
-- stream id, or ''), an event that entered its stream before the last release of this
-- lease by another event's run is refused as superseded ({2, released_ms,
-- released_message_id}): it waited in a consumer's read-ahead buffer while the issue
-- was being worked on, and would have been dropped as locked had it been looked at
-- then. nil otherwise.
--
-- rec, when given, is the done record read already (false: none), as a batch reads
-- its nexts' records in one MGET.
local function superseded_by_release(done, entry_ms, message_id, rec)
  if entry_ms == '' then return nil end
  local d = rec
  if d == nil then d = redis.call('GET', done) end
  if not d then return nil end
  local ms, mid = string.match(d, '^(%d+) (%S+)')
  if not ms or tonumber(entry_ms) >= tonumber(ms) then return nil end
  -- The released entry's own repeat (a retry after its run) is never superseded by it:
  -- the same id in the same stream, when the record and the caller name streams. Read
  -- only for an event that entered before the release (the rare case).
  local released = holder_entry(mid, string.match(d, '^%d+ %S+ %d+ (.+)$'))
  if not same_entry(released, message_id) and not stepped_back(ms) then
    return {2, tonumber(ms), mid}
  end
  return nil
end

-- superseded_by_follow_up: the coalesce and deliver policies' superseded check. An event
-- is superseded only if a queued follow-up was published after it entered its stream
-- (the done record's third field, kept across releases): that newer follow-up stands
-- for it ({2, published_ms, released_message_id}). nil otherwise: it is the follow-up
-- nobody queued because it waited in a read-ahead buffer.
local function superseded_by_follow_up(done, entry_ms)
  if entry_ms == '' then return nil end
  local d = redis.call('GET', done)
  if not d then return nil end
  local _, mid, rq = string.match(d, '^(%d+) (%S+) (%d+)')
  if rq and tonumber(entry_ms) < tonumber(rq) and not stepped_back(rq) then
    return {2, tonumber(rq), mid}
  end
  return nil
end

-- shared_busy is the reply for a shared key (lock, info) held by another run: a busy
-- lease's, with its holder's agent, its lock key and its holder's issue appended; nil
-- when the key is free.
local function shared_busy(lock, info)
  if redis.call('EXISTS', lock) == 0 then return nil end
  local h = redis.call('HMGET', info, 'owner', 'fence', 'acquired_at', 'message_id', 'agent', 'issue')
  return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', lock), 0, h[5] or '', lock, h[6] or ''}
end

-- shared_take takes a free shared key (lock, info, fence) for token and returns its new
-- fence; its record names the agent and issue of the run holding it.
local function shared_take(lock, info, fence, token, ttl_ms, owner, acquired_at_ms, message_id, agent, issue)
  redis.call('SET', lock, token, 'PX', ttl_ms)
  return record(info, fence, token, ttl_ms, owner, acquired_at_ms, message_id, 'agent', agent, 'issue', issue)
end

-- acquire: take the lease (take), refused as superseded by a later release
-- (superseded_by_release) and safe to repeat (own_repeat). On conflict it returns the
-- holder's record (holder_busy).
--
-- Returns {1, fence}, {2, released_ms, released_message_id} or
-- {0, owner, fence, acquired_at, message_id, pttl}.
--
-- With gfrom (acquire_scoped.lua), KEYS[gfrom..] are the lease's shared keys, in
-- triples (lock, info, fence): taken with the lease, all or nothing, each with the same
-- token and its own fence, its record naming agent and issue. A busy one is reported
-- like a busy lease, with its holder's agent and its lock key appended. The fences of
-- the shared keys follow the lease's in the reply.
local function acquire(lock, info, fence, done, token, ttl_ms, owner, acquired_at_ms, message_id, entry_ms, gfrom, agent, issue, done_rec)
  if not gfrom then
    -- The lease's own key alone: the SET NX comes first, so the common case (a free
    -- key) costs no GET of it. A superseded event's SET is undone in this same atomic
    -- step (it wrote nothing else); a held key then goes through the same checks, in
    -- the same order, as below: its own repeat, superseded, busy.
    if redis.call('SET', lock, token, 'NX', 'PX', ttl_ms) then
      local sup = superseded_by_release(done, entry_ms, message_id, done_rec)
      if sup then
        redis.call('DEL', lock)
        return sup
      end
      return {1, record(info, fence, token, ttl_ms, owner, acquired_at_ms, message_id)}
    end
    local own = own_repeat(lock, info, fence, token)
    if own then return {1, own} end
    return superseded_by_release(done, entry_ms, message_id, done_rec) or holder_busy(lock, info)
  end
  local own, cur = own_repeat(lock, info, fence, token)
  if own then
    local r = {1, own}
    if gfrom then
      for i = gfrom, lease_nkeys, 3 do
        table.insert(r, held_fence(KEYS[i + 1], KEYS[i + 2]))
      end
    end
    return r
  end
  local sup = superseded_by_release(done, entry_ms, message_id)
  if sup then return sup end
  if gfrom and not cur then
    for i = gfrom, lease_nkeys, 3 do
      local busy = shared_busy(KEYS[i], KEYS[i + 1])
      if busy then return busy end
    end
  end
  local f = take(lock, info, fence, token, ttl_ms, owner, acquired_at_ms, message_id)
  if not f then return holder_busy(lock, info) end
  local r = {1, f}
  if gfrom then
    for i = gfrom, lease_nkeys, 3 do
      table.insert(r, shared_take(KEYS[i], KEYS[i + 1], KEYS[i + 2], token, ttl_ms, owner, acquired_at_ms, message_id, agent, issue))
    end
  end
  return r
end

-- publish_queued appends the queued follow-up q (HGETALL of the queue: its fields, and
-- _stream, the stream it goes to) to its stream and files it in the issue's index of
-- that stream with xonce's own step (index_entry, internal/xonce/index.lua, put before
-- this file). Standalone Redis only: on Cluster the stream is in another slot. Returns
-- its id.
local function publish_queued(q, o)
  local stream = ''
  local args = {'XADD', '', 'MAXLEN', '~', o.maxlen, '*'}
  if tonumber(o.maxlen) <= 0 then args = {'XADD', '', '*'} end
  for i = 1, #q, 2 do
    if q[i] == '_stream' then stream = q[i + 1]
    elseif q[i] ~= '_qid' and q[i] ~= '_mbox' then table.insert(args, q[i]); table.insert(args, q[i + 1]) end
  end
  args[2] = stream
  local id = redis.call(unpack(args))
  if o.issue and o.issue ~= '' then
    local idx, since = index_keys(stream, o.issue)
    index_entry(stream, idx, since, id, o.idx_max, o.idx_ttl)
  end
  return id
end

-- record_done writes a run's done record, "<released_ms> <mid> <last_follow_up_ms>",
-- then " <stream>" when mid names its entry's stream ('<id> <stream>': the superseded
-- check tells the released entry's repeat from the twin stream's entry of its id),
-- dated now. Its follow-up field is now when the release publishes a follow-up
-- (published), else kept from the record it replaces: read by the SET itself (GET),
-- and written again only in the rare case that it was set.
local function record_done(done, now, mid, published)
  local id, stream = split_entry(mid)
  local rec, tail = now .. ' ' .. id .. ' ', ''
  if stream ~= '' then tail = ' ' .. stream end
  if published then
    redis.call('SET', done, rec .. now .. tail, 'PX', 86400000)
    return
  end
  local old = redis.call('SET', done, rec .. '0' .. tail, 'PX', 86400000, 'GET')
  local rq = string.match(old or '', '^%d+ %S+ (%d+)')
  if rq and rq ~= '0' then redis.call('SET', done, rec .. rq .. tail, 'PX', 86400000) end
end

-- release: the end of a lease, whichever way it ends (a run's release or hand-off, a
-- give-back, a superseded run's stop), written once. k: lock, info, done, queue,
-- mailbox. o: token; outcome, 'ran' or 'given_back'; mid, the lease's message id;
-- mode, '1' on standalone Redis, '0' on Cluster; maxlen, published (the _qid the
-- caller has published, or ''), issue, idx_max, idx_ttl (for publish_queued),
-- published_ms (Cluster: the time of that follow-up's stream id; the done record is
-- dated no later, so the follow-up is never superseded by the run it follows), now
-- (a batch's: the server time, in ms, to date the done record by; default TIME).
--
-- 1. Compare-and-delete: a foreign lease (another token, or a Python agent's plain
--    key) is never deleted.
-- 2. A run's release records when (server time) and for which message it happened, for
--    the superseded checks: the done record is "<released_ms> <mid>
--    <last_follow_up_ms>". Only outcome 'ran' writes it: a lease given back (taken
--    ahead for an entry that never reached it, or not acknowledged by the replicas)
--    had no run, and no event may count as superseded by it.
-- 3. Drain: whether to publish the queued follow-up is the key's own state (a queue
--    exists), never the caller's choice, so no holder strands one: a holder that took
--    the lease over, or that did not expect a follow-up, drains it too. The queue of a
--    lease held by someone else is never touched (its holder drains it); that of a
--    lease nobody holds (ours expired or was force-released) is drained. The deliver
--    policy's queued event (field _mbox) stands for the follow-ups in the mailbox: when
--    the run accounted for all of them (it is empty) it is dropped, not published. A
--    published follow-up sets the done record's third field (a run's release only).
--    On standalone Redis the follow-up is appended here (publish_queued); on Cluster
--    its stream is in another slot, so while a follow-up is queued that the caller has
--    not published (its _qid is not published), nothing changes and it is returned
--    ({3, field, value, ...}) for the caller to publish (once, by its _qid) and call
--    again: a crash in between leaves it queued, not lost.
--
-- Returns {released}, {released, 1, new id} (standalone: a follow-up published),
-- {released, 2} (Cluster: the published follow-up's slot deleted) or {3, q...}. A
-- repeat after a lost reply finds the lease gone and the queue empty: it does nothing.
local function release(k, o)
  local lock, info, done, queue, mailbox = k[1], k[2], k[3], k[4], k[5]
  local mine = redis.call('GET', lock) == o.token
  local q = {}
  if mine or redis.call('EXISTS', lock) == 0 then q = redis.call('HGETALL', queue) end
  local qid, mbox = '', false
  for i = 1, #q, 2 do
    if q[i] == '_qid' then qid = q[i + 1] end
    if q[i] == '_mbox' then mbox = true end
  end
  if mbox and redis.call('XLEN', mailbox) == 0 then
    redis.call('DEL', queue, mailbox)
    q = {}
  end
  if o.mode ~= '1' and #q > 0 and qid ~= o.published then return {3, unpack(q)} end
  local released = 0
  if mine then
    redis.call('DEL', lock, info)
    if o.outcome == 'ran' and o.mid ~= '' then
      -- A batch (handoff_batch.lua) reads the clock once for all its releases and
      -- dates each by when its run ended (o.now).
      local now = o.now
      if not now then
        local t = redis.call('TIME')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
      end
      -- On Cluster the follow-up was appended before this call: dated after it, the
      -- release would make the follow-up count as superseded by the run it follows.
      local pms = tonumber(o.published_ms or '')
      if pms and pms < now then now = pms end
      record_done(done, now, o.mid, #q > 0)
    end
    released = 1
  end
  if #q == 0 then return {released} end
  redis.call('DEL', queue)
  if o.mode ~= '1' then return {released, 2} end
  return {released, 1, publish_queued(q, o)}
end

-- release_shared: compare-and-delete of the lease's shared keys, KEYS[from..] in pairs
-- (lock, info): whatever became of the lease's own key, a shared key that still holds
-- token is ours and goes. A repeat finds them gone. Returns whether every one was ours.
local function release_shared(token, from)
  local all = true
  for i = from, lease_nkeys, 2 do
    if redis.call('GET', KEYS[i]) == token then redis.call('DEL', KEYS[i], KEYS[i + 1]) else all = false end
  end
  return all
end

-- stopping: the number of runs superseded on this lease (policy supersede) that have not
-- stopped yet, other than token's own: fields of the stop hash, token -> "<deadline_ms>
-- <newer message id> <new fence>". A field past its deadline (the superseded run's key
-- would have expired by then: its holder is dead or has given the lease up by itself)
-- counts as stopped and is deleted.
--
-- Every acquire that grants a lease asks (granted_stopping), whatever its policy: the
-- stop hash is the key's own state, so a worker whose rules never supersede still
-- waits for a run that another worker's take-over left stopping. With no stop hash
-- (nearly always) that costs one HGETALL of a missing key.
local function stopping(stop, token)
  local h = redis.call('HGETALL', stop)
  if #h == 0 then return 0 end
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local n = 0
  for i = 1, #h, 2 do
    local deadline = tonumber(string.match(h[i + 1], '^(%d+)')) or 0
    if deadline <= now then
      redis.call('HDEL', stop, h[i])
    elseif h[i] ~= token then
      n = n + 1
    end
  end
  return n
end

-- granted_stopping appends to r, an acquire's reply, the runs still stopping on the
-- key (stopping) when r grants the lease: {1, fence, stopping}. Any other reply is
-- returned as it is.
local function granted_stopping(r, stop, token)
  if r[1] == 1 then table.insert(r, stopping(stop, token)) end
  return r
end
