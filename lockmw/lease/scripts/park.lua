-- park.lua (after pause.lua): an event of a paused scope, whose lease its worker took
-- and gives back, is put in the pause's line and, on standalone Redis, its stream entry
-- is acked, in this one script: it is never both out of the stream's pending list and
-- out of the line. The pause is checked again here, atomically with the park: a pause
-- resumed since the worker's check lets the event run ({0}).
--
-- The record of a parked entry is kept by its stream entry (seen, '<stream> <id>'), not
-- by its lid: a repeat of that very entry (a redelivery after its worker died between
-- this script and its ack, on Cluster) is acked and not parked twice, while a copy of
-- the event (another entry, which a resume appended) is an event of its own again.
--
-- KEYS: reg, seen, line[, source stream]
-- ARGV: name, lid, copy ('1': a copy a resume appended), stream, group, entry id,
-- seen_ttl_ms, field, value, ...
-- Returns {0, 0} not paused (run it), {1, position} parked (1: the line's head), or
-- {2, 0} a repeat of an entry parked already (acked, not parked again).
local name, lid, copy, stream = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local pkey = stream .. ' ' .. ARGV[6]
local function ack()
  if #KEYS >= 4 then redis.call('XACK', KEYS[4], ARGV[5], ARGV[6]) end
end
if redis.call('HGET', KEYS[2], pkey) == 'w' then
  ack()
  return {2, 0}
end
local st = pause_state(KEYS[1], name)
if not st or (st == 'resuming' and copy == '1') then return {0, 0} end
local e = {lid, pause_now(), '_stream', stream}
for i = 8, #ARGV do e[#e + 1] = ARGV[i] end
local ms, seq = string.match(lid, '^(%d+)-(%d+)$')
if not ms then ms, seq = pause_now(), 0 end
local member = string.format('%012d', tonumber(seq)) .. ' ' .. cjson.encode(e)
redis.call('ZADD', KEYS[3], ms, member)
redis.call('HSET', KEYS[2], pkey, 'w')
redis.call('PEXPIRE', KEYS[2], ARGV[7])
ack()
return {1, (redis.call('ZRANK', KEYS[3], member) or -1) + 1}
