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

-- The issue-index step, written once: the functions down to the line "-- end of the
-- index step" are also put before the lease's steps (xonce.IndexLua, before
-- lockmw/lease/scripts/lease.lua, whose release appends a queued follow-up on
-- standalone Redis), so every append filed in an issue's index is filed by this code.

-- index_keys are the keys of issue's index of stream and of the stream's index-since
-- marker: in the stream's hash slot (the stream's own hash tag if it has one, else the
-- whole name as the tag). xonce.IndexKey and xonce.IndexSinceKey name them in Go.
local function index_keys(stream, issue)
  local tag = stream
  if not string.find(stream, '^[^{]*{[^}]+}') then tag = '{' .. stream .. '}' end
  return tag .. ':issue:' .. issue, tag .. ':issue-index-since'
end

-- index_entry files the new entry id of stream in the issue's index idx: its entry
-- ids, scored by their millisecond, members "<ms>-<seq, 10 digits>" so that ids of one
-- millisecond sort by sequence. Bounded three ways: the newest index_max ids, none older
-- than the stream's first entry (what a trim of the stream cut goes from the index at
-- its next write), and a TTL (index_ttl_ms) renewed by each write. since remembers the
-- first id ever indexed in this stream: readers scan only what is older.
local function index_entry(stream, idx, since, id, index_max, index_ttl_ms)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  redis.call('ZADD', idx, ms, ms .. '-' .. string.format('%010d', tonumber(seq)))
  redis.call('ZREMRANGEBYRANK', idx, 0, -tonumber(index_max) - 1)
  local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  if #first > 0 then
    local fms = tonumber(string.match(first[1][1], '^(%d+)-'))
    redis.call('ZREMRANGEBYSCORE', idx, '-inf', '(' .. fms)
  end
  redis.call('PEXPIRE', idx, index_ttl_ms)
  redis.call('SET', since, id, 'NX')
end
-- end of the index step

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
    -- The issue's index of this stream (index_entry, above).
    index_entry(KEYS[1], KEYS[3], KEYS[4], id, ARGV[8], ARGV[9])
  end
end
if ARGV[4] ~= '' then
  redis.call('XACK', KEYS[k], ARGV[4], ARGV[5])
  if ARGV[6] == '1' then redis.call('XDEL', KEYS[k], ARGV[5]) end
end
return id
