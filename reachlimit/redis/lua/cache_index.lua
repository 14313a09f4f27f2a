-- Index the entry of `digest` in `index` (a ZSET: digest -> expiry, ms of Redis time) for
-- `lives` ms (cache_settings.lua), keeping at most `size` entries: leaves `evicted`, the
-- digests it dropped from the index (the first to expire, so the oldest set), whose entries
-- the caller deletes.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', index, '-inf', now)  -- their entries expired by themselves
-- Scores strictly increase, so that sets within one millisecond keep their order too.
local score = now + lives
local newest = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
if #newest > 0 and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 0.01 end
redis.call('ZADD', index, score, digest)
local evicted = {}
local over = redis.call('ZCARD', index) - size
if over > 0 then
  -- Many at once when the size was just made smaller (not one ZREM of them all: Lua's
  -- unpack has a bound).
  evicted = redis.call('ZRANGE', index, 0, over - 1)
  redis.call('ZREMRANGEBYRANK', index, 0, over - 1)
end
redis.call('PEXPIRE', index, lives)
