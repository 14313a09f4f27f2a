-- A cache's settings, read from Redis: its settings hash (KEYS[1]), which every process writes
-- when it starts using the cache, the newest start winning (settings.lua). ARGV[1..3] this
-- process's own ttl (ms), stale window (ms) and size: used for any setting the hash lacks (Redis
-- restarted empty, the key evicted, a field that is not a number), and written back, so a set
-- never fails for want of its settings and the first process to notice re-creates the hash.
-- Leaves `ttl`, `stale`, `size` and `lives` (how long an entry lives in Redis: fresh for `ttl`,
-- then within its stale window for `stale`).
local recorded = redis.call('HMGET', KEYS[1], 'ttl_ms', 'stale_ms', 'size')
local ttl, stale, size = tonumber(recorded[1]), tonumber(recorded[2]), tonumber(recorded[3])
if not ttl then
  ttl = tonumber(ARGV[1])
  redis.call('HSET', KEYS[1], 'ttl_ms', ARGV[1])
end
if not stale then
  stale = tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'stale_ms', ARGV[2])
end
if not size then
  size = tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'size', ARGV[3])
end
local lives = ttl + stale
