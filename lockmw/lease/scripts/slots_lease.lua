-- slots_lease.lua (after lease.lua and slots.lua; standalone Redis only): a run's slots
-- taken, renewed and freed in its lease's own scripts (slots.go, "one script"). The
-- slots' KEYS and ARGV follow the lease script's own, and this step takes them off the
-- end (lease_nkeys, lease_nargs):
--   KEYS: ..., per limit key its six keys (slots_keys), [the event's source stream]
--   ARGV: ..., lid, hold_ms, lane, fair, weight, maxlen, idx_max, idx_ttl, seen_ttl_ms,
--         record, group, entry_id, takeover ('1': the policy may take a lease another
--         token holds: supersede, wait), acked ('1': the source stream is a key), then
--         each limit key's N, then the number of limit keys.
-- A release passes the same ARGV (record, group and entry_id unused) and no stream.
-- Every script that takes this step has ARGV[1] the lease's token and ARGV[2] its
-- ttl_ms: a slot's holder is the lease's token and frees when the lease would expire.
local slots_n = tonumber(ARGV[#ARGV])
local slots_at = #ARGV - 1 - slots_n - 14
local slots_acked = ARGV[slots_at + 14] == '1'
lease_nargs = slots_at
lease_nkeys = #KEYS - 6 * slots_n - (slots_acked and 1 or 0)
local so = {token = ARGV[1], ttl_ms = ARGV[2], lid = ARGV[slots_at + 1], hold_ms = ARGV[slots_at + 2],
  lane = ARGV[slots_at + 3], fair = ARGV[slots_at + 4], weight = ARGV[slots_at + 5], mode = '1',
  maxlen = ARGV[slots_at + 6], idx_max = ARGV[slots_at + 7], idx_ttl = ARGV[slots_at + 8],
  seen_ttl = ARGV[slots_at + 9], rec = ARGV[slots_at + 10], group = ARGV[slots_at + 11],
  entry = ARGV[slots_at + 12], takeover = ARGV[slots_at + 13] == '1'}

-- slots_key is limit key i's keys, with its N set in so.limit (slots_promote reads it).
local function slots_key(i)
  so.limit = ARGV[slots_at + 14 + i]
  return slots_keys(lease_nkeys + 1 + 6 * (i - 1))
end

-- slots_pass frees member (a holder) of k and hands what is free to the next waiters.
local function slots_pass(k, member, now)
  redis.call('ZREM', k.holders, member)
  slots_used(k, now)
  slots_promote(k, so, now, nil, nil)
end

-- slots_state is what the run finds on limit key k: 'own' (the lease's token holds a
-- slot: a repeat after a lost reply), 'handed' (a slot waits for this event), 'free', or
-- nil: full, or others wait before it. Slots that freed by themselves are first handed
-- to the events already waiting (the waker's work, done here so nobody jumps the line).
local function slots_state(k, now)
  local used = slots_used(k, now)
  if redis.call('ZSCORE', k.holders, so.token) then return 'own' end
  if redis.call('ZSCORE', k.holders, 'w:' .. so.lid) then return 'handed' end
  if used < tonumber(so.limit) and slots_waiting(k) > 0 then
    slots_promote(k, so, now, nil, nil)
    used = redis.call('ZCARD', k.holders)
  end
  if used < tonumber(so.limit) and slots_waiting(k) == 0 then return 'free' end
  return nil
end

local function slots_hold(k, now)
  redis.call('ZREM', k.holders, 'w:' .. so.lid)
  redis.call('ZADD', k.holders, now + tonumber(so.ttl_ms), so.token)
  redis.call('HSET', k.meta, 'limit', so.limit)
  redis.call('PEXPIRE', k.holders, so.seen_ttl)
  redis.call('PEXPIRE', k.meta, so.seen_ttl)
end

local function slots_ack()
  if slots_acked then redis.call('XACK', KEYS[#KEYS], so.group, so.entry) end
end

-- slots_waiting_reply is the reply of an event that waits for a slot of limit key i:
-- {4, i, state (1 joined, 2 waiting already), position, used, waiting}.
local function slots_waiting_reply(i, k, state, pos)
  return {4, i, state, pos, redis.call('ZCARD', k.holders), slots_waiting(k)}
end

-- slots_waits_already: an event that waits in a line already (a redelivery of its entry)
-- is acked and nothing else. Returns its reply, or nil.
local function slots_waits_already()
  for i = 1, slots_n do
    local k = slots_key(i)
    if redis.call('HEXISTS', k.recs, so.lid) == 1 then
      slots_ack()
      local pos = redis.call('ZRANK', k.wait[1], so.lid)
      if not pos then pos = (redis.call('ZRANK', k.wait[2], so.lid) or 0) + redis.call('ZCARD', k.wait[1]) end
      return slots_waiting_reply(i, k, 2, pos + 1)
    end
  end
  return nil
end

-- slots_acquire is the combined acquire: acquire_fn is the policy's own acquire (its
-- script's body). In this order:
--   1. the event waits for a slot already: acked, nothing else;
--   2. every limit key has a slot for it (own, handed or free), or a slot is full but
--      the lease is held by another run and the policy never takes a held lease: the
--      policy's acquire runs; if it took the lease, the run takes every slot with it;
--      if not (busy: the policy's part), it takes none and gives back any handed to it;
--   3. a slot is full and the lease could be the run's: the event joins that key's line
--      at its fair place and is acked, and takes nothing: no lease, no other slot (a
--      slot handed to it on another key goes on to that key's next waiter).
-- So no state has a run's slots without its lease, or its lease without its slots.
local function slots_acquire(acquire_fn)
  local w = slots_waits_already()
  if w then return w end
  local now = slots_now()
  local states, full = {}, nil
  for i = 1, slots_n do
    states[i] = slots_state(slots_key(i), now)
    if not states[i] and not full then full = i end
  end
  local cur = redis.call('GET', KEYS[1])
  local held = cur and cur ~= so.token
  if not full or (held and not so.takeover) then
    local r = acquire_fn()
    for i = 1, slots_n do
      local k = slots_key(i)
      if r[1] == 1 and not full then
        slots_hold(k, now)
      elseif states[i] == 'handed' then
        slots_pass(k, 'w:' .. so.lid, now)
      end
    end
    return r
  end
  for i = 1, slots_n do
    local k = slots_key(i)
    if states[i] == 'handed' then slots_pass(k, 'w:' .. so.lid, now) end
    if states[i] == 'own' then slots_pass(k, so.token, now) end
  end
  local k = slots_key(full)
  local pos = slots_park(k, so, now)
  slots_ack()
  return slots_waiting_reply(full, k, 1, pos)
end

-- slots_release frees the run's slots (its lease's token) and hands each to its key's
-- next waiter (slots_free.lua's step), in its lease's release.
local function slots_release()
  local now = slots_now()
  for i = 1, slots_n do slots_pass(slots_key(i), so.token, now) end
end
