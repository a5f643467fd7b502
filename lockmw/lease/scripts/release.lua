-- release.lua (after lease.lua): give the lease back, and its shared keys; see release
-- and release_shared in lease.lua.
--
-- KEYS: lock, info, done[, shared lock, shared info]... ARGV: token, message_id.
local r = release(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
if #KEYS > 3 then release_shared(ARGV[1], 4) end
return r
