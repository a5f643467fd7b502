-- mailbox_done removes follow-ups a run accounted for (delivered to it, or rolled into
-- it from an earlier run) from the lease's mailbox, only while the lease is held: a
-- run that lost its lease proved nothing, and its follow-ups stay for the next one.
-- XDEL is safe to repeat: an id gone already counts nothing.
--
-- KEYS: lock, mailbox. ARGV: token, id, ...
-- Returns the number removed, or -1 when the lease is not held with token.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if #ARGV < 2 then return 0 end
local n = redis.call('XDEL', KEYS[2], unpack(ARGV, 2))
-- An empty mailbox goes: it is made again by the next follow-up.
if redis.call('XLEN', KEYS[2]) == 0 then redis.call('DEL', KEYS[2]) end
return n
