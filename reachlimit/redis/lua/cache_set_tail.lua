-- The end of the set on one Redis (after cache_set.lua and cache_index.lua): the evicted
-- entries deleted here (same hash tag, same Redis). Replies {how many, ttl (ms), stale (ms)}:
-- the settings the entry was set with.
for _, old in ipairs(evicted) do
  redis.call('DEL', prefix .. old)
end
return {#evicted, ttl, stale}
