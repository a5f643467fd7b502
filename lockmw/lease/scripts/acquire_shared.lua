-- acquire_shared.lua (after lease.lua): take one shared key alone, for a lease whose
-- own keys are in another hash slot (a group key on Redis Cluster: the agent's keys
-- stay in the slot of {<agent>:<ISSUE>}, whatever the event's group, so one script
-- cannot take both). The caller has taken the lease's own key first and gives it back
-- when this reports the shared key busy. Safe to repeat: a key that already holds
-- token is this acquire's, and its fence is returned again.
--
-- KEYS: lock, info, fence. ARGV: token, ttl_ms, owner, acquired_at_ms, message_id,
-- agent, issue. Returns {1, fence}, or a busy shared key's reply (see shared_busy).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {1, held_fence(KEYS[2], KEYS[3])}
end
local busy = shared_busy(KEYS[1], KEYS[2])
if busy then return busy end
return {1, shared_take(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])}
