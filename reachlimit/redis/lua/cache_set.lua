-- Set one entry. KEYS[1] the index, KEYS[2] the entry; ARGV[1] the entry key prefix, ARGV[2] the
-- digest, ARGV[3] the encoded value, ARGV[4] ttl (ms), ARGV[5] size.
local index, entry = KEYS[1], KEYS[2]
local prefix, digest = ARGV[1], ARGV[2]
local ttl, size = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', index, '-inf', now)  -- their entries expired by themselves
redis.call('SET', entry, ARGV[3], 'PX', ttl)
-- Scores strictly increase, so that sets within one millisecond keep their order too.
local score = now + ttl
local newest = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
if #newest > 0 and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 0.01 end
redis.call('ZADD', index, score, digest)
local over = redis.call('ZCARD', index) - size
if over > 0 then
  local oldest = redis.call('ZRANGE', index, 0, over - 1)
  for _, old in ipairs(oldest) do
    redis.call('DEL', prefix .. old)
    redis.call('ZREM', index, old)
  end
end
redis.call('PEXPIRE', index, ttl)
return over > 0 and over or 0
