-- acquire_or_supersede.lua (after lease.lua): the supersede policy's acquire. The lease
-- is taken as acquire does; if it is held by the run of an OLDER event (its message id,
-- a stream id, is below ours), that run is superseded in the same step: the lock key
-- gets our token (so the old holder's fenced writes are refused from now on), the fence
-- is bumped, the info record names us, and the old token is filed in the stop hash with
-- the old key's expiry as its deadline: our run starts only once every superseded run
-- has stopped (its holder deletes its field) or its deadline passed (stopping()). A
-- holder whose event is newer than ours, or the same entry, or that has no message id
-- (a plain key, e.g. a Python agent's) is not superseded: the event is reported busy,
-- with newer = 1 when the holder's event is the newer one.
--
-- Safe to repeat: a repeat finds the lock holding our token and returns the same lease
-- (acquire's repeat), with the message id it superseded read back from the info record.
--
-- KEYS: lock, info, fence, done, stop. ARGV: token, ttl_ms, owner, acquired_at_ms,
-- message_id, entry_ms (unused: see the superseded check below).
-- Returns {1, fence, stopping, superseded_message_id or '', superseded (1 if this call
-- superseded a run)}, acquire's {2, ...}, or acquire's busy reply with newer appended.

-- older reports whether stream id a is below stream id b ("<ms>-<seq>").
local function older(a, b)
  local ams, aseq = string.match(a or '', '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b or '', '^(%d+)-(%d+)$')
  if not ams or not bms then return false end
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq < bseq)
end

local lock, info, fence, stop = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local token, ttl_ms, message_id = ARGV[1], ARGV[2], entry_id(ARGV[5])
-- The superseded check by order of events, not by time: an event whose issue was last
-- released by the run of a NEWER event lost to it; one that waited while an older
-- event's run went on is the newest, and runs (acquire's check by entry time, for the
-- drop policy, would count it as superseded: it is skipped here).
local d = redis.call('GET', KEYS[4])
if d and redis.call('GET', lock) ~= token then
  local ms, mid = string.match(d, '^(%d+) (%S+)')
  if mid and older(message_id, mid) then return {2, tonumber(ms), mid} end
end
local r = acquire(lock, info, fence, KEYS[4], token, ttl_ms, ARGV[3], ARGV[4], ARGV[5], '')
if r[1] == 1 then
  table.insert(r, stopping(stop, token))
  table.insert(r, redis.call('HGET', info, 'supersedes') or '')
  table.insert(r, 0)
  return r
end
if r[1] ~= 0 then return r end
local old = redis.call('GET', lock)
local h = redis.call('HMGET', info, 'token', 'message_id')
if not old or h[1] ~= old or not older(h[2], message_id) then
  table.insert(r, older(message_id, h[2]) and 1 or 0)
  return r
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local pttl = redis.call('PTTL', lock)
if pttl < 0 then pttl = tonumber(ttl_ms) end
redis.call('SET', lock, token, 'PX', ttl_ms)
redis.call('DEL', info)
local f = record(info, fence, token, ttl_ms, ARGV[3], ARGV[4], ARGV[5], 'supersedes', h[2])
redis.call('HSET', stop, old, (now + pttl) .. ' ' .. message_id .. ' ' .. f)
if redis.call('PTTL', stop) < pttl then redis.call('PEXPIRE', stop, pttl) end
return {1, f, stopping(stop, token), h[2], 1}
