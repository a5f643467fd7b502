-- usage.lua (after common.lua): a run reports what a call cost. Counted once per
-- (run, seq): a retried report returns 'counted' again and adds nothing. It settles the
-- run's open reservation (the reserved amount becomes the reported spend) and appends
-- the report to the issue's usage stream (cost, history).
--
-- KEYS: lock, info, ledger, res, runs, usage stream, issues index (zset).
-- ARGV: token, fence, agent, seq, micro, tokens_in, tokens_out, tool_calls, model,
--       now_ms, issue, maxlen.
-- Returns {answer, spent}.
local lock, info, ledger, res, runs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local agent, seq = ARGV[3], tonumber(ARGV[4])
local field = agent .. '|' .. ARGV[2]
if not ours(lock, info, ARGV[1], ARGV[2]) then return {'stale_fence', 0} end
local prev = repeat_of(runs, field, seq)
if prev then return {prev, tonumber(redis.call('HGET', ledger, 'spent') or '0')} end
local micro = tonumber(ARGV[5])
local spent = redis.call('HINCRBY', ledger, 'spent', micro)
redis.call('HINCRBY', ledger, 'spent:' .. agent, micro)
redis.call('HINCRBY', ledger, 'tokens_in', ARGV[6])
redis.call('HINCRBY', ledger, 'tokens_out', ARGV[7])
redis.call('HINCRBY', ledger, 'tool_calls', ARGV[8])
redis.call('HINCRBY', ledger, 'reports', 1)
redis.call('HDEL', res, field)
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[12], '*', 'agent', agent, 'fence', ARGV[2], 'seq', ARGV[4],
  'model', ARGV[9], 'micro', ARGV[5], 'tokens_in', ARGV[6], 'tokens_out', ARGV[7], 'tool_calls', ARGV[8])
redis.call('ZADD', KEYS[7], ARGV[10], ARGV[11])
redis.call('HSET', runs, field, seq .. ' counted')
return {'counted', spent}
