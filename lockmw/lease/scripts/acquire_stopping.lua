-- acquire_stopping.lua (after lease.lua): acquire, for an agent some of whose events
-- supersede (AcquireOptions.Stopping): a lease taken also reports the runs still
-- stopping on the key (stopping in lease.lua), superseded by a take-over whose lease
-- was then given back before they stopped. Its run waits for them (Lease.WaitStopped):
-- the key was free, but those runs may still be running.
--
-- KEYS: lock, info, fence, done, stop. ARGV: token, ttl_ms, owner, acquired_at_ms,
-- message_id, entry_ms or ''. Returns acquire's reply, with stopping appended to {1, fence}.
local r = acquire(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
if r[1] == 1 then table.insert(r, stopping(KEYS[5], ARGV[1])) end
return r
