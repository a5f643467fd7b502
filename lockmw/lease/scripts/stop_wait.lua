-- stop_wait.lua (after lease.lua): how many runs superseded on this lease have not
-- stopped yet, other than token's own (see stopping in lease.lua). Safe to repeat.
--
-- KEYS: stop. ARGV: token. Returns the number.
return stopping(KEYS[1], ARGV[1])
