-- xadd_once: append to a stream at most once per append id, so that a client that sends
-- the same append again (its first reply was lost) adds nothing and learns the first
-- entry's id. Optionally checks a lease token first (a fenced write), records the new
-- entry in its issue's index, and acks (and deletes) a source entry in the same step.
--
-- With a take member, the append is made only while that member is in the take set (a
-- sorted set in the stream's hash slot: a delayed event waiting to be promoted), and
-- removes it in the same step, so no member outlives the append it made: a promoter that
-- dies between the two can resume any time later, after the marker has expired too.
--
-- A fenced append checks every lock key of the lease: its own and its shared keys
-- (scopes issue and group), each must hold the token.
--
-- KEYS: stream, marker, index, index-since[, lock...][, ack stream][, take set]. The
-- marker, the index keys and the take set are in the stream's hash slot; the locks and
-- the ack stream are passed only on standalone Redis.
-- ARGV: maxlen (0 = no trim), marker_ttl_ms, token ('' = no check), ack_group ('' = no
-- ack), ack_id, ack_delete ('1' or ''), issue ('' = no index), index_max, index_ttl_ms,
-- take member ('' = none), number of lock keys, field, value, ...
-- Returns the entry's id ('' when the take member was gone, appended by someone else:
-- nothing is done), or the error LEASELOST.
local locks = tonumber(ARGV[11])
local k = 5 + locks
local id = redis.call('GET', KEYS[2])
if id and ARGV[10] ~= '' then
  -- A repeat (the marker is there) still takes the member: the take set is the last key.
  redis.call('ZREM', KEYS[#KEYS], ARGV[10])
end
if not id then
  for i = 5, 4 + locks do
    if redis.call('GET', KEYS[i]) ~= ARGV[3] then
      return redis.error_reply('LEASELOST lease is no longer held')
    end
  end
  if ARGV[10] ~= '' and redis.call('ZREM', KEYS[#KEYS], ARGV[10]) == 0 then return '' end
  local args = {'XADD', KEYS[1]}
  if tonumber(ARGV[1]) > 0 then
    table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[1])
  end
  table.insert(args, '*')
  for i = 12, #ARGV do table.insert(args, ARGV[i]) end
  id = redis.call(unpack(args))
  redis.call('SET', KEYS[2], id, 'PX', ARGV[2])
  if ARGV[7] ~= '' then
    -- The issue's index of this stream: its entry ids, scored by their millisecond.
    -- Bounded three ways: the newest index_max ids, none older than the stream's first
    -- entry (what a trim of the stream cut goes from the index at its next write), and
    -- a TTL renewed by each write. index-since remembers the first id ever indexed in
    -- this stream: readers scan only what is older.
    -- Members are "<ms>-<seq, 10 digits>": ids of one millisecond sort by sequence.
    local ms, seq = string.match(id, '^(%d+)-(%d+)$')
    redis.call('ZADD', KEYS[3], ms, ms .. '-' .. string.format('%010d', tonumber(seq)))
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[8]) - 1)
    local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
    if #first > 0 then
      local fms = tonumber(string.match(first[1][1], '^(%d+)-'))
      redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. fms)
    end
    redis.call('PEXPIRE', KEYS[3], ARGV[9])
    redis.call('SET', KEYS[4], id, 'NX')
  end
end
if ARGV[4] ~= '' then
  redis.call('XACK', KEYS[k], ARGV[4], ARGV[5])
  if ARGV[6] == '1' then redis.call('XDEL', KEYS[k], ARGV[5]) end
end
return id
