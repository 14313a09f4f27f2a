-- A warm cache shared through Redis (RedisCache, reachlimit/redis/_cache.py, whose design note
-- says what each operation is for): its sets and its clear, the first argument naming which.
--
-- KEYS (one hash tag, C = {<prefix>:<name>:cache}: one Cluster slot)
--   1 C:settings  HASH  the cache's settings: ttl_ms, stale_ms, size, and who wrote them (by)
--   2 C:index     ZSET  digest -> expiry (ms, Redis time) of every entry, scores strictly
--                       increasing, so the index is in the order of the sets
--   3 the entry (set only): C:e:<digest>
-- Keys built from C, the text of KEYS[2] before "index": the entries, C:e:<digest> (set and
-- clear, on one Redis; on a Cluster the entries are keys of their own, spread over slots, and
-- the caller sets and deletes them there: index and drain).
--
-- ARGV
--   1 the operation: set (one Redis), index (a Cluster's set), clear (one Redis) or drain (a
--     Cluster's clear)
--   set, index   2 this process's ttl (ms), 3 stale window (ms), 4 size: used for what the
--                settings hash lacks (below); 5 the digest
--   set          6 the encoded value, 7 how long it took to build (ms)
--
-- Run on its own, say: redis-cli --eval cache.lua {p:n:cache}:settings {p:n:cache}:index , drain

local op = ARGV[1]
local settings, index = KEYS[1], KEYS[2]
local entries = string.sub(index, 1, -6) .. 'e:'  -- "C:" of "C:index", then "e:"

if op == 'clear' then
  -- Empty the cache: every entry in its index, then the index. Replies how many entries were
  -- deleted. (An entry evicted from the index under an allkeys-* policy is not found here; it
  -- ends with its own TTL.)
  local deleted = 0
  for _, digest in ipairs(redis.call('ZRANGE', index, 0, -1)) do
    deleted = deleted + redis.call('DEL', entries .. digest)
  end
  redis.call('DEL', index)
  return deleted
end

if op == 'drain' then
  -- Empty the index on a Redis Cluster (its entries live on other slots: the caller deletes
  -- them there). Replies every digest it held.
  local digests = redis.call('ZRANGE', index, 0, -1)
  redis.call('DEL', index)
  return digests
end

if op ~= 'set' and op ~= 'index' then
  return redis.error_reply('cache.lua: no operation ' .. tostring(op))
end

-- The cache's settings, read from Redis: its settings hash, which every process writes when
-- it starts using the cache, the newest start winning (settings.lua). A setting the hash lacks
-- (Redis restarted empty, the key evicted, a field that is not a number) is this process's
-- own, written back, so a set never fails for want of its settings and the first process to
-- notice re-creates the hash. An entry lives `lives` ms in Redis: fresh for `ttl`, then
-- within its stale window for `stale`.
local recorded = redis.call('HMGET', settings, 'ttl_ms', 'stale_ms', 'size')
local ttl, stale, size = tonumber(recorded[1]), tonumber(recorded[2]), tonumber(recorded[3])
if not ttl then
  ttl = tonumber(ARGV[2])
  redis.call('HSET', settings, 'ttl_ms', ARGV[2])
end
if not stale then
  stale = tonumber(ARGV[3])
  redis.call('HSET', settings, 'stale_ms', ARGV[3])
end
if not size then
  size = tonumber(ARGV[4])
  redis.call('HSET', settings, 'size', ARGV[4])
end
local lives = ttl + stale
local digest = ARGV[5]

if op == 'set' then
  -- The entry's SET. With a stale window the entry starts with a header of its build time and
  -- its window, "t<build ms>,<stale ms>;", so that whoever reads it knows when it turns stale
  -- (reachlimit/redis/_cache.py).
  local value = ARGV[6]
  if stale > 0 then value = 't' .. ARGV[7] .. ',' .. stale .. ';' .. value end
  redis.call('SET', KEYS[3], value, 'PX', lives)
end

-- Index the entry for `lives` ms, keeping at most `size` entries: those dropped from the
-- index are the first to expire, so the oldest set.
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

if op == 'index' then
  -- A Cluster's set (the caller SETs the entry on its own node after this, with the settings
  -- answered here). Replies {ttl (ms), stale (ms), digests evicted...}: the caller deletes
  -- those entries on their nodes.
  local reply = {ttl, stale}
  for _, old in ipairs(evicted) do reply[#reply + 1] = old end
  return reply
end

-- The set: the evicted entries are deleted here (same hash tag, same Redis). Replies {how
-- many, ttl (ms), stale (ms)}: the settings the entry was set with.
for _, old in ipairs(evicted) do
  redis.call('DEL', entries .. old)
end
return {#evicted, ttl, stale}
