-- slots_take.lua (after lease.lua and slots.lua): a run takes a slot of one limit key, or
-- its event waits for one. Finding the key full and joining its line are this one
-- script, and on standalone Redis so is the ack of the event's entry: no release can
-- come between "full" and "waiting" (the lost wake-up of a separate park step).
--
-- In this order:
--   1. the holders name token: a repeat of this take (a lost reply): taken;
--   2. a slot was handed to the event ('w:<lid>', its copy's take): it becomes token's;
--   3. the event waits already (a redelivery of its entry): acked, nothing else;
--   4. a slot is free and nobody waits: taken;
--   5. otherwise the event joins the line at its fair place and is acked; if slots are
--      free (a dead holder's expired) they are handed out at once, in the line's order,
--      and the event may be among them: then it takes its slot here.
--
-- KEYS: holders, wait1, wait2, recs, meta, handed[, source stream]
-- ARGV: token, lid, limit, ttl_ms, hold_ms, lane ('1' priority, '2' batch), fair value,
-- weight, mode ('1' standalone, '0' Cluster), maxlen, idx_max, idx_ttl, seen_ttl_ms,
-- record (JSON, see slots.lua), group, entry_id.
-- Returns {1, how} (how: 'own', 'handed', 'free', 'expired') or
-- {0, state, position, used, waiting, handed record, ...}: state 1 joined, 2 waiting
-- already; the handed records are the waiters a Cluster caller has to append.
local k = slots_keys(1)
local o = {token = ARGV[1], lid = ARGV[2], limit = ARGV[3], ttl_ms = ARGV[4], hold_ms = ARGV[5], lane = ARGV[6],
  fair = ARGV[7], weight = ARGV[8], mode = ARGV[9], maxlen = ARGV[10], idx_max = ARGV[11], idx_ttl = ARGV[12],
  seen_ttl = ARGV[13], rec = ARGV[14]}
local now = slots_now()
local function ack()
  if #KEYS >= 7 then redis.call('XACK', KEYS[7], ARGV[15], ARGV[16]) end
end
local function hold()
  redis.call('ZADD', k.holders, now + tonumber(o.ttl_ms), o.token)
  redis.call('HSET', k.meta, 'limit', o.limit)
  redis.call('PEXPIRE', k.holders, o.seen_ttl)
  redis.call('PEXPIRE', k.meta, o.seen_ttl)
end
local used = slots_used(k, now)
if redis.call('ZSCORE', k.holders, o.token) then return {1, 'own'} end
if redis.call('ZREM', k.holders, 'w:' .. o.lid) == 1 then
  hold()
  return {1, 'handed'}
end
if redis.call('HEXISTS', k.recs, o.lid) == 1 then
  ack()
  local lane = 2
  local pos = redis.call('ZRANK', k.wait[1], o.lid)
  if pos then lane = 1 else pos = (redis.call('ZRANK', k.wait[2], o.lid) or 0) + redis.call('ZCARD', k.wait[1]) end
  return {0, 2, pos + 1, used, slots_waiting(k)}
end
if used < tonumber(o.limit) and slots_waiting(k) == 0 then
  hold()
  return {1, 'free'}
end
local pos = slots_park(k, o, now)
local handed, took = slots_promote(k, o, now, o.lid, o.token)
if took then
  hold()
  return {1, 'expired'}
end
ack()
local r = {0, 1, pos, redis.call('ZCARD', k.holders), slots_waiting(k)}
for _, rec in ipairs(handed) do r[#r + 1] = rec end
return r
