-- release.lua (after lease.lua): the end of a lease on every path but the standalone
-- hand-off (handoff.lua): give the lease back, publish its queued follow-up if it has
-- one, and release its shared keys; see release and release_shared in lease.lua.
--
-- KEYS: lock, info, done, queue, mailbox[, shared lock, shared info]...
-- ARGV: token, outcome ('ran' or 'given_back'), message_id, mode ('1' standalone, '0'
-- Cluster), maxlen, published_qid ('' if none), issue, index max, index TTL (ms),
-- published_ms (the time of the published follow-up's stream id, or '').
-- Returns release's reply; the shared keys go with the lease (not while a follow-up
-- waits to be published: nothing changed then). Its first field is 1 if it deleted the
-- lease and every shared key, still ours; 2 if it deleted the lease but a shared key
-- was no longer ours (another run held it meanwhile: the run was not exclusive); 0 if
-- the lease was not ours; 3 while a queued follow-up waits to be published.
local r = release({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}, {token = ARGV[1], outcome = ARGV[2],
  mid = ARGV[3], mode = ARGV[4], maxlen = ARGV[5], published = ARGV[6], issue = ARGV[7],
  idx_max = ARGV[8], idx_ttl = ARGV[9], published_ms = ARGV[10]})
if r[1] ~= 3 and lease_nkeys > 5 and not release_shared(ARGV[1], 6) and r[1] == 1 then r[1] = 2 end
return r
