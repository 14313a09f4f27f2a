-- A cold leader's one round trip (after its cache miss): claim the key's flight, recheck the
-- cache, acquire a build slot, in one go. KEYS[1..9] the limiter's (its settings KEYS[9]),
-- KEYS[10] F:lead, KEYS[11] F:n, KEYS[12] the cache entry; ARGV[1..3] the limiter's (its
-- presence and this process's settings, limiter_settings.lua), ARGV[4] the limiter token,
-- ARGV[5] the client id, ARGV[6..9] the flight's (base, token, lease, keep). Replies {status,
-- flight, outcome or entry or admission}:
--   {0, n, a, ms}  flight n claimed, and the acquire answered a: 1 granted, 2 queued (for ms
--                  milliseconds: the budget's wait)
--   {1, n}     follow flight n (someone leads it)            as the flight's join answers
--   {2, n, o}  flight n has ended with outcome o              as the flight's join answers
--   {3, 0, e}  no flight, and the cache holds e now: nothing claimed, nothing acquired
--   {4, 0, a}  no flight, and the acquire answered a (0 refused, 3 token given up): nothing
--              claimed, so nobody can follow, and no outcome is ever published
local joined = join_claimed()
if joined then return joined end
local entry = redis.call('GET', KEYS[K + 3])
if entry then return {3, 0, entry} end
