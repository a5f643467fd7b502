-- release.lua (after lease.lua): give the lease back, and its shared keys; see release
-- and release_shared in lease.lua.
--
-- Returns 1 if it deleted the lease and every shared key, still ours; 2 if it deleted
-- the lease but a shared key was no longer ours (another run held it meanwhile: the run
-- was not exclusive); 0 if the lease was not ours.
--
-- KEYS: lock, info, done[, shared lock, shared info]... ARGV: token, message_id.
local r = release(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
if #KEYS > 3 and not release_shared(ARGV[1], 4) and r == 1 then r = 2 end
return r
