-- acquire.lua (after lease.lua): take the lease (acquire in lease.lua); a lease taken
-- also reports the runs still stopping on the key (granted_stopping), superseded by a
-- take-over whose lease ended before they stopped. Its run waits for them
-- (Lease.WaitStopped): the key was free, but those runs may still be running.
--
-- KEYS: lock, info, fence, done, stop. ARGV: token, ttl_ms, owner, acquired_at_ms,
-- message_id, entry_ms or ''. Returns acquire's reply, with stopping appended to {1, fence}.
return granted_stopping(acquire(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]),
  KEYS[5], ARGV[1])
