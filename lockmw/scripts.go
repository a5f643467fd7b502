package lockmw

import "github.com/redis/go-redis/v9"

// Each script touches only the keys of one lease (one hash slot under KeysCluster) and
// runs atomically, so compare-and-act has no window.

// acquireScript: SET NX PX the token; on success take the next fence and write the
// operator record, all in the one round trip. On conflict return the holder's record so
// the caller can name the holder without a second round trip.
//
// KEYS: lock, info, fence. ARGV: token, ttl_ms, owner, acquired_at_ms, message_id.
var acquireScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[3], 'fence', fence,
    'acquired_at', ARGV[4], 'message_id', ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {1, fence}
end
local h = redis.call('HMGET', KEYS[2], 'owner', 'fence', 'acquired_at', 'message_id')
return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1])}
`)

// extendScript: compare-and-PEXPIRE of both expiring keys.
//
// KEYS: lock, info. ARGV: token, ttl_ms.
var extendScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
`)

// releaseScript: compare-and-delete. A foreign lease (another token, or a Python agent's
// plain key) is never deleted.
//
// KEYS: lock, info. ARGV: token.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1], KEYS[2]) > 0 and 1 or 0
end
return 0
`)

// forceReleaseScript: the operator's override. It deletes whatever holds the lease and
// bumps the fence so that the evicted holder's fenced writes are refused from now on.
//
// KEYS: lock, info, fence. Returns the new fence.
var forceReleaseScript = redis.NewScript(`
redis.call('DEL', KEYS[1], KEYS[2])
return redis.call('INCR', KEYS[3])
`)

// fencedXAddScript: append to a stream only while the lease is still ours. Standalone
// Redis only (the stream and the lease are in different slots on a cluster).
//
// KEYS: lock, stream. ARGV: token, maxlen (0 = none), field, value, ...
var fencedXAddScript = redis.NewScript(`
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
`)
