-- slots_free.lua (after lease.lua and slots.lua): a run's end frees its slot of one limit
-- key and hands it to the next waiter in the same script (slots_promote: the priority
-- lane first, then the fair order; one waiter per free slot, nobody else is woken), its
-- copy appended on standalone Redis. With no holder named it is the waker: it hands out
-- the slots that freed by themselves (a dead holder's, a hand-over whose copy never came)
-- and does nothing else, so it is safe from any worker at any time. A repeat (a lost
-- reply) finds the holder gone and the slots handed already: it does nothing twice.
--
-- KEYS: holders, wait1, wait2, recs, meta, handed
-- ARGV: limit, ttl_ms, hold_ms, mode, maxlen, idx_max, idx_ttl, seen_ttl_ms, holder...
-- Returns {freed, used, waiting, handed record, ...}: the handed records are those a
-- Cluster caller has to append.
local k = slots_keys(1)
local o = {limit = ARGV[1], ttl_ms = ARGV[2], hold_ms = ARGV[3], mode = ARGV[4], maxlen = ARGV[5],
  idx_max = ARGV[6], idx_ttl = ARGV[7], seen_ttl = ARGV[8]}
local freed = 0
for i = 9, #ARGV do freed = freed + redis.call('ZREM', k.holders, ARGV[i]) end
local now = slots_now()
slots_used(k, now)
local handed = slots_promote(k, o, now, nil, nil)
local r = {freed, redis.call('ZCARD', k.holders), slots_waiting(k)}
for _, rec in ipairs(handed) do r[#r + 1] = rec end
return r
