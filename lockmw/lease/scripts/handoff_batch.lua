-- handoff_batch.lua (after lease.lua): the ends of several runs and the starts of the
-- next entries' leases, on standalone Redis, in one atomic step and in this order:
-- each run's release (release in lease.lua, outcome ran: its queued follow-up, if
-- any, is published) followed by the XACK of its entry; then each next entry's lease
-- taken ahead (acquire in lease.lua). The releases come first, so an entry of an
-- issue whose run ends here meets the released key (and its superseded check), as it
-- would one round trip later. The clock is read once: each release is dated by when
-- its run ended (now minus its ago_ms), not by when the batch was sent, so an event
-- that entered the stream after a run ended is never counted as superseded by it.
--
-- KEYS: per end, lock, info, done, queue, mailbox, stream; then per next, lock, info,
-- fence, done.
-- ARGV: ends, nexts, index max, index TTL (ms); per end, token, message_id, group,
-- entry_id, maxlen, issue, ago_ms; per next, token, ttl_ms, owner, acquired_at_ms,
-- message_id, entry_ms or ''.
-- Returns, per end, released, acked, published follow-up id or ''; then per next, the
-- length of acquire's reply followed by that reply.
local ends, nexts = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {}
for i = 0, ends - 1 do
  local k, a = i * 6, 4 + i * 7
  local r = release({KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]}, {token = ARGV[a + 1],
    outcome = 'ran', mid = ARGV[a + 2], mode = '1', maxlen = ARGV[a + 5], published = '', issue = ARGV[a + 6],
    idx_max = ARGV[3], idx_ttl = ARGV[4], now = now - tonumber(ARGV[a + 7])})
  out[#out + 1] = r[1]
  out[#out + 1] = redis.call('XACK', KEYS[k + 6], ARGV[a + 3], ARGV[a + 4])
  out[#out + 1] = r[3] or ''
end
for j = 0, nexts - 1 do
  local k, a = ends * 6 + j * 4, 4 + ends * 7 + j * 6
  local r = acquire(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4], ARGV[a + 5], ARGV[a + 6])
  out[#out + 1] = #r
  for _, v in ipairs(r) do out[#out + 1] = v end
end
return out
