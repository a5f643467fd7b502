-- append: one audit record, and its id filed in the index of each issue it names, in
-- one atomic step, so that `history KEY` finds the operator actions on an issue without
-- scanning the trail. The index keys are the stream's hash slot (xonce.IndexKey's form),
-- and index-since is set once, as every indexing writer of this module does.
-- KEYS: stream, index-since, index...
-- ARGV: maxlen (0 = no trim), index_max, index_ttl_ms, field, value, ...
local args = {'XADD', KEYS[1]}
if tonumber(ARGV[1]) > 0 then
  table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[1])
end
table.insert(args, '*')
for i = 4, #ARGV do table.insert(args, ARGV[i]) end
local id = redis.call(unpack(args))
if #KEYS > 2 then
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  local member = ms .. '-' .. string.format('%010d', tonumber(seq))
  for i = 3, #KEYS do
    redis.call('ZADD', KEYS[i], ms, member)
    redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -tonumber(ARGV[2]) - 1)
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  end
end
-- Set on every append, indexed or not: readers scan only what is older than it.
redis.call('SET', KEYS[2], id, 'NX')
return id
