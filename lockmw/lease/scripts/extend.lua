-- extend: compare-and-PEXPIRE of every expiring key of the lease: its lock and info,
-- then those of its shared keys (scopes issue and group). If any lock is not ours, none
-- is extended: the lease is lost. With slots (standalone Redis: ARGV[3] holders keys at
-- the end of KEYS, slots_lease.lua), the run's slot on each moves to a TTL from now as
-- well, in the same step: a slot frees when its lease would expire, never before. A slot
-- that is gone while the lease is ours (nothing frees one but its lease's release or
-- expiry) loses the lease too: a run never goes on without its slots.
--
-- KEYS: lock, info[, shared lock, shared info]...[, slot holders]...
-- ARGV: token, ttl_ms[, number of slot holders keys].
local nk = #KEYS - tonumber(ARGV[3] or '0')
for i = 1, nk, 2 do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
local now = 0
if nk < #KEYS then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
for i = nk + 1, #KEYS do
  if tonumber(redis.call('ZSCORE', KEYS[i], ARGV[1]) or '0') <= now then return 0 end
end
for i = 1, nk do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
for i = nk + 1, #KEYS do redis.call('ZADD', KEYS[i], 'XX', now + tonumber(ARGV[2]), ARGV[1]) end
return 1
