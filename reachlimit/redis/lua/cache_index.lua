-- Index the entry of `digest` in `index` (a ZSET: digest -> expiry, ms of Redis time) for
-- `ttl` ms, keeping at most `size` entries: leaves `evicted`, the digests it dropped from
-- the index (the first to expire, so the oldest set), whose entries the caller deletes.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', index, '-inf', now)  -- their entries expired by themselves
-- Scores strictly increase, so that sets within one millisecond keep their order too.
local score = now + ttl
local newest = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
if #newest > 0 and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 0.01 end
redis.call('ZADD', index, score, digest)
local evicted = {}
local over = redis.call('ZCARD', index) - size
if over > 0 then
  evicted = redis.call('ZRANGE', index, 0, over - 1)
  redis.call('ZREM', index, unpack(evicted))
end
redis.call('PEXPIRE', index, ttl)
