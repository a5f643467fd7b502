-- extend: compare-and-PEXPIRE of every expiring key of the lease: its lock and info,
-- then those of its shared keys (scopes issue and group). If any lock is not ours, none
-- is extended: the lease is lost.
--
-- KEYS: lock, info[, shared lock, shared info]... ARGV: token, ttl_ms.
for i = 1, #KEYS, 2 do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
