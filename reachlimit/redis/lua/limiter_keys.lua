-- The limiter's fixed keys (KEYS[1..9], in _limiter.KEY_SUFFIXES order; KEYS[9] is the budget's
-- settings hash) and the keys built from their hash tag T: one client's waiters (T:c:<id>) and a
-- waiter's doorbell (T:w:<token>), so that every key a script touches is in one slot.
local holders, queue, alive, deadlines, stats, seq =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local clientof, clients, settings = KEYS[7], KEYS[8], KEYS[9]
local tag = string.sub(holders, 1, -8)  -- "T:" of "T:holders"
local of_client = tag .. 'c:'  -- .. id: one client's waiters (a doorbell's prefix, T:w:, is
                               -- `bell`, built with the general steps: limiter_steps.lua)
-- No wasted waits (limiter_took.lua, limiter_deadline.lua): when each promoted grant began (a
-- HASH token -> ms), and the latest durations of those grants (a LIST of ms, newest first).
local since, durations = tag .. 'since', tag .. 'took'
