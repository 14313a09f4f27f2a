-- The limiter's fixed keys (KEYS[1..8], in _KEY_SUFFIXES order) and the prefix of one client's
-- waiters.
local holders, queue, alive, deadlines, stats, seq =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local clientof, clients = KEYS[7], KEYS[8]
local of_client = string.sub(holders, 1, -8) .. 'c:'  -- .. id: one client's waiters
