-- fenced_xadd: append to a stream only while the lease is still ours. Standalone
-- Redis only (the stream and the lease are in different slots on a cluster).
--
-- KEYS: lock, stream. ARGV: token, maxlen (0 = none), field, value, ...
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASELOST lease is no longer held')
end
local args = {'XADD', KEYS[2]}
if tonumber(ARGV[2]) > 0 then
  table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[2])
end
table.insert(args, '*')
for i = 3, #ARGV do table.insert(args, ARGV[i]) end
return redis.call(unpack(args))
