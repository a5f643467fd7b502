-- checkpoint.lua (after common.lua): a run saves its progress. Refused unless the run
-- holds its lease and its fence is not older than the saved checkpoint's (fences only
-- grow, so a late write of a superseded run never replaces its successor's).
--
-- KEYS: lock, info, checkpoint (hash), runs. ARGV: token, fence, agent, seq, data, now_ms.
-- Returns the answer.
local lock, info, ck, runs = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local field = ARGV[3] .. '|' .. ARGV[2]
if not ours(lock, info, ARGV[1], ARGV[2]) then return 'stale_fence' end
local prev = repeat_of(runs, field, tonumber(ARGV[4]))
if prev then return prev end
local saved = tonumber(redis.call('HGET', ck, 'fence') or '0')
if saved > tonumber(ARGV[2]) then return 'stale_fence' end
redis.call('HSET', ck, 'fence', ARGV[2], 'seq', ARGV[4], 'data', ARGV[5], 'at', ARGV[6])
redis.call('HSET', runs, field, ARGV[4] .. ' saved')
return 'saved'
