-- xadd_once: append to a stream at most once per append id, so that a client that sends
-- the same append again (its first reply was lost) adds nothing and learns the first
-- entry's id. Optionally checks a lease token first (a fenced write) and acks (and
-- deletes) a source entry in the same step.
--
-- KEYS: stream, marker[, lock][, ack stream]. The marker is in the stream's hash slot;
-- the lock and the ack stream are passed only on standalone Redis.
-- ARGV: maxlen (0 = no trim), marker_ttl_ms, token ('' = no check), ack_group ('' = no
-- ack), ack_id, ack_delete ('1' or ''), field, value, ...
-- Returns the entry's id, or the error LEASELOST.
local k = 3
if ARGV[3] ~= '' then k = 4 end
local id = redis.call('GET', KEYS[2])
if not id then
  if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then
    return redis.error_reply('LEASELOST lease is no longer held')
  end
  local args = {'XADD', KEYS[1]}
  if tonumber(ARGV[1]) > 0 then
    table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[1])
  end
  table.insert(args, '*')
  for i = 7, #ARGV do table.insert(args, ARGV[i]) end
  id = redis.call(unpack(args))
  redis.call('SET', KEYS[2], id, 'PX', ARGV[2])
end
if ARGV[4] ~= '' then
  redis.call('XACK', KEYS[k], ARGV[4], ARGV[5])
  if ARGV[6] == '1' then redis.call('XDEL', KEYS[k], ARGV[5]) end
end
return id
