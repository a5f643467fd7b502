-- acquire_scoped.lua (after lease.lua): take the lease and its shared keys (scopes issue
-- and group) in one step, all or nothing; see acquire in lease.lua. Nothing is held
-- while waiting, so two runs wanting overlapping keys cannot deadlock.
--
-- KEYS: lock, info, fence, done, stop, then per shared key: lock, info, fence.
-- ARGV: token, ttl_ms, owner, acquired_at_ms, message_id, entry_ms or '', agent, issue.
-- Returns acquire's reply; a grant's, {1, fence, shared fences...}, with the runs still
-- stopping on the lease's own key appended (granted_stopping).
return granted_stopping(acquire(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], 6, ARGV[7], ARGV[8]),
  KEYS[5], ARGV[1])
