-- The end of the index step on a Redis Cluster (after cache_index_spread.lua and
-- cache_index.lua). Replies {ttl (ms), stale (ms), digests evicted...}.
local reply = {ttl, stale}
for _, old in ipairs(evicted) do reply[#reply + 1] = old end
return reply
