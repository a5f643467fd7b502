-- lease.lua: the steps of the lease, put before acquire.lua, release.lua and
-- handoff.lua so that each step is written once.

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

-- acquire: SET NX PX the token; on success take the next fence and write the
-- operator record, all in the one round trip. On conflict return the holder's record so
-- the caller can name the holder without a second round trip.
--
-- With an entry time (entry_ms, the ms part of the event's stream id), an event that
-- entered its stream before the last release of this lease by another event's run is
-- refused as superseded ({2, released_ms, released_message_id}): it waited in a
-- consumer's read-ahead buffer while the issue was being worked on, and would have been
-- dropped as locked had it been looked at then.
--
-- It is safe to repeat: when the lock already holds token (go-redis sent the script
-- again after the first try's reply was lost), it returns the lease that try made,
-- with its fence, instead of reporting the issue locked by its own holder.
--
-- Returns {1, fence}, {2, released_ms, released_message_id} or
-- {0, owner, fence, acquired_at, message_id, pttl}.
--
-- With gfrom (acquire_scoped.lua), KEYS[gfrom..] are the lease's shared keys, in
-- triples (lock, info, fence): taken with the lease, all or nothing, each with the same
-- token and its own fence, its record naming agent and issue. A busy one is reported
-- like a busy lease, with its holder's agent and its lock key appended. The fences of
-- the shared keys follow the lease's in the reply.
local function acquire(lock, info, fence, done, token, ttl_ms, owner, acquired_at_ms, message_id, entry_ms, gfrom, agent, issue)
  local cur = redis.call('GET', lock)
  if cur == token then
    local r = {1, tonumber(redis.call('HGET', info, 'fence') or redis.call('GET', fence) or 0)}
    if gfrom then
      for i = gfrom, #KEYS, 3 do
        table.insert(r, tonumber(redis.call('HGET', KEYS[i + 1], 'fence') or redis.call('GET', KEYS[i + 2]) or 0))
      end
    end
    return r
  end
  if entry_ms ~= '' then
    local d = redis.call('GET', done)
    if d then
      local ms, mid = string.match(d, '^(%d+) (%S+)')
      if ms and tonumber(entry_ms) < tonumber(ms) and mid ~= message_id and not stepped_back(ms) then
        return {2, tonumber(ms), mid}
      end
    end
  end
  if gfrom and not cur then
    for i = gfrom, #KEYS, 3 do
      if redis.call('EXISTS', KEYS[i]) == 1 then
        local h = redis.call('HMGET', KEYS[i + 1], 'owner', 'fence', 'acquired_at', 'message_id', 'agent', 'issue')
        return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[i]), 0, h[5] or '', KEYS[i], h[6] or ''}
      end
    end
  end
  if redis.call('SET', lock, token, 'NX', 'PX', ttl_ms) then
    local f = redis.call('INCR', fence)
    redis.call('HSET', info, 'token', token, 'owner', owner, 'fence', f,
      'acquired_at', acquired_at_ms, 'message_id', message_id)
    redis.call('PEXPIRE', info, ttl_ms)
    local r = {1, f}
    if gfrom then
      for i = gfrom, #KEYS, 3 do
        redis.call('SET', KEYS[i], token, 'PX', ttl_ms)
        local gf = redis.call('INCR', KEYS[i + 2])
        redis.call('HSET', KEYS[i + 1], 'token', token, 'owner', owner, 'fence', gf, 'agent', agent,
          'issue', issue, 'acquired_at', acquired_at_ms, 'message_id', message_id)
        redis.call('PEXPIRE', KEYS[i + 1], ttl_ms)
        table.insert(r, gf)
      end
    end
    return r
  end
  local h = redis.call('HMGET', info, 'owner', 'fence', 'acquired_at', 'message_id')
  return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', lock)}
end

-- release: compare-and-delete. A foreign lease (another token, or a Python agent's
-- plain key) is never deleted. The release of a run records when (server time) and for
-- which message (message_id: the one its acquire wrote into info) it happened, for the
-- superseded checks: the done record is "<released_ms> <message_id>
-- <last_follow_up_ms>". A lease given back without a run (taken ahead for an entry
-- that never reached it) passes an empty mid and records nothing: no event is
-- superseded by a run that did not happen. Returns 1 if it deleted the lease; a repeat
-- finds the lease gone and changes nothing.
local function release(lock, info, done, token, mid)
  if redis.call('GET', lock) ~= token then return 0 end
  redis.call('DEL', lock, info)
  if mid and mid ~= '' then
    local t = redis.call('TIME')
    local prev = string.match(redis.call('GET', done) or '', '^%d+ %S+ (%d+)') or '0'
    redis.call('SET', done, (t[1] * 1000 + math.floor(t[2] / 1000)) .. ' ' .. mid .. ' ' .. prev, 'PX', 86400000)
  end
  return 1
end

-- release_shared: compare-and-delete of the lease's shared keys, KEYS[from..] in pairs
-- (lock, info): whatever became of the lease's own key, a shared key that still holds
-- token is ours and goes. A repeat finds them gone. Returns whether every one was ours.
local function release_shared(token, from)
  local all = true
  for i = from, #KEYS, 2 do
    if redis.call('GET', KEYS[i]) == token then redis.call('DEL', KEYS[i], KEYS[i + 1]) else all = false end
  end
  return all
end

-- stopping: the number of runs superseded on this lease (policy supersede) that have not
-- stopped yet, other than token's own: fields of the stop hash, token -> "<deadline_ms>
-- <newer message id> <new fence>". A field past its deadline (the superseded run's key
-- would have expired by then: its holder is dead or has given the lease up by itself)
-- counts as stopped and is deleted.
local function stopping(stop, token)
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local h = redis.call('HGETALL', stop)
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
