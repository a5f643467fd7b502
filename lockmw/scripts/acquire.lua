-- acquire: SET NX PX the token; on success take the next fence and write the
-- operator record, all in the one round trip. On conflict return the holder's record so
-- the caller can name the holder without a second round trip.
--
-- With an entry time (ARGV[6], the ms part of the event's stream id), an event that
-- entered its stream before the last release of this lease by another event's run is
-- refused as superseded ({2, released_ms, released_message_id}): it waited in a
-- consumer's read-ahead buffer while the issue was being worked on, and would have been
-- dropped as locked had it been looked at then.
--
-- KEYS: lock, info, fence, done. ARGV: token, ttl_ms, owner, acquired_at_ms,
-- message_id, entry_ms or ''.
if ARGV[6] ~= '' then
  local d = redis.call('GET', KEYS[4])
  if d then
    local ms, mid = string.match(d, '^(%d+) (%S+)')
    if ms and tonumber(ARGV[6]) < tonumber(ms) and mid ~= ARGV[5] then return {2, tonumber(ms), mid} end
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[3], 'fence', fence,
    'acquired_at', ARGV[4], 'message_id', ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {1, fence}
end
local h = redis.call('HMGET', KEYS[2], 'owner', 'fence', 'acquired_at', 'message_id')
return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1])}
