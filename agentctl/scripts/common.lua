-- common.lua: prepended to every agentctl script.
--
-- ours: the run still holds its lease. The lease library's keys (lockmw/lease/keys.go):
-- the lock string holds the holder's token, the info hash its fence; both expire with
-- the lease. A superseded, lost or expired run fails here, whatever it asks.
local function ours(lock, info, token, fence)
  return redis.call('GET', lock) == token and redis.call('HGET', info, 'fence') == fence
end

-- repeat_of: a request's sequence number against the run's last one (runs hash field
-- "<agent>|<fence>" -> "<seq> <answer>"). The same seq again (a retry after a lost
-- reply) returns the answer it got; a lower one is stale; nil means new.
local function repeat_of(runs, field, seq)
  local v = redis.call('HGET', runs, field)
  if not v then return nil end
  local sp = string.find(v, ' ', 1, true)
  local last = tonumber(string.sub(v, 1, sp - 1))
  if seq == last then return string.sub(v, sp + 1) end
  if seq < last then return 'stale_seq' end
  return nil
end

-- live_reserved: the sum of the issue's live reservations, and of agent's. A
-- reservation ("<agent>|<fence>" -> "<micro> <lock key> <token>") lives while its run
-- holds its lease: one whose lock is gone (expired: a dead run's) or holds another
-- token (superseded, lost) is void and removed. skip is the asking run's own field.
local function live_reserved(res, agent, skip)
  local all, mine = 0, 0
  local flat = redis.call('HGETALL', res)
  for i = 1, #flat, 2 do
    local field, v = flat[i], flat[i + 1]
    local amount, lock, token = string.match(v, '^(%d+) (%S+) (%S+)$')
    if not amount or redis.call('GET', lock) ~= token then
      redis.call('HDEL', res, field)
    elseif field ~= skip then
      all = all + tonumber(amount)
      if string.sub(field, 1, #agent + 1) == agent .. '|' then mine = mine + tonumber(amount) end
    end
  end
  return all, mine
end
