-- extend: compare-and-PEXPIRE of both expiring keys.
--
-- KEYS: lock, info. ARGV: token, ttl_ms.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
