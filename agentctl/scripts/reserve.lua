-- reserve.lua (after common.lua): a run asks to reserve ARGV[5] micro-USD before an
-- expensive call. Granted when the issue's spend, its live reservations (every run of
-- every agent) and this run's open reservation plus the amount stay within the issue's
-- budget, and the same for the agent's; 0 means no budget. A grant adds to the run's
-- one open reservation, which the run's next usage report settles.
--
-- KEYS: lock, info, ledger, res, runs.
-- ARGV: token, fence, agent, seq, micro, issue_budget, agent_budget.
-- Returns {answer, spent, reserved (live, others and this run's), budget (effective)}.
local lock, info, ledger, res, runs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local agent, seq, micro = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local field = agent .. '|' .. ARGV[2]
if not ours(lock, info, ARGV[1], ARGV[2]) then return {'stale_fence', 0, 0, 0} end
local raised = tonumber(redis.call('HGET', ledger, 'raised') or '0')
local spent = tonumber(redis.call('HGET', ledger, 'spent') or '0')
local aspent = tonumber(redis.call('HGET', ledger, 'spent:' .. agent) or '0')
local ib, ab = tonumber(ARGV[6]), tonumber(ARGV[7])
if ib > 0 then ib = ib + raised end
if ab > 0 then ab = ab + raised end
local others, mine = live_reserved(res, agent, field)
local own = 0
local cur = redis.call('HGET', res, field)
if cur then own = tonumber(string.match(cur, '^(%d+)')) end
local prev = repeat_of(runs, field, seq)
if prev then return {prev, spent, others + own, ib} end
local answer = 'granted'
if ib > 0 and spent + others + own + micro > ib then
  answer = 'denied_issue'
elseif ab > 0 and aspent + mine + own + micro > ab then
  answer = 'denied_agent'
end
if answer == 'granted' then
  own = own + micro
  redis.call('HSET', res, field, own .. ' ' .. lock .. ' ' .. ARGV[1])
end
redis.call('HSET', runs, field, seq .. ' ' .. answer)
return {answer, spent, others + own, ib}
