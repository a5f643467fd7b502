-- release_line.lua (after lease.lua and line.lua): the end of a wait policy's lease
-- (every path: a run's end, a failed run, a give-back), and its hand-over, in one atomic
-- step: release the lease (release in lease.lua: its queued follow-up too), then end the
-- event's turn as done says, then hand the key to the head of the line (line_promote:
-- nobody jumps the line, and exactly one event is woken, the next). done: '1' the run
-- finished (it is acked): record that it ran, end its turn; '2' the run failed (its
-- retry, or its dead letter, comes later): end its turn, so that a failure that ends in
-- the dead-letter queue strands nobody (its retry joins the line again); '0' no run
-- (a give-back): keep the turn. A crashed run releases nothing: its turn stays for its
-- redelivery. On standalone Redis the event's entry is acked here too (KEYS[10]).
--
-- KEYS: lock, info, done, queue, mailbox, fence, line, seen, turn[, stream]
-- ARGV: token, outcome, message_id, mode, maxlen, published_qid, issue, index max,
-- index TTL, published_ms, lid, done ('1', '2' or '0'), hold_ms, seen_ttl_ms, published (lid@joined_ms of the head published),
-- group, entry_id, then the lids of the key's pending entries earlier than the head
-- (line_blocked: while one is not in the line, the key is not handed over).
-- Returns {released, published follow-up id or '', promoted lid or '', its new id or ''},
-- release's {3, ...} (Cluster: a coalesced follow-up to publish first), or line_promote's
-- {5, released, lid@joined_ms, field, value, ...} (Cluster: the head to publish, then call again). A repeat
-- after a lost reply finds the lease gone: it hands over nothing twice.
local r = release({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}, {token = ARGV[1], outcome = ARGV[2],
  mid = ARGV[3], mode = ARGV[4], maxlen = ARGV[5], published = ARGV[6], issue = ARGV[7],
  idx_max = ARGV[8], idx_ttl = ARGV[9], published_ms = ARGV[10]})
if r[1] == 3 then return r end
local k = line_keys(KEYS[1], KEYS[2], KEYS[6], 7)
if ARGV[12] ~= '0' and ARGV[11] ~= '' then
  if ARGV[12] == '1' then
    redis.call('HSET', k.seen, ARGV[11], 'r')
    redis.call('PEXPIRE', k.seen, ARGV[14])
  end
  if redis.call('GET', k.turn) == ARGV[11] then redis.call('DEL', k.turn) end
end
if #KEYS >= 10 then redis.call('XACK', KEYS[10], ARGV[16], ARGV[17]) end
local p = line_promote(k, {mode = ARGV[4], published = ARGV[15], hold_ms = ARGV[13], seen_ttl = ARGV[14],
  maxlen = ARGV[5], issue = ARGV[7], idx_max = ARGV[8], idx_ttl = ARGV[9], blocked = line_blocked(k.line, k.seen, 18)})
if p and p[1] == 5 then return {5, r[1], unpack(p, 2)} end
local plid, pid = '', ''
if p then plid, pid = p[2], p[3] end
return {r[1], r[3] or '', plid, pid}
