-- The index step of a set on a Redis Cluster, where entries spread over slots: after
-- cache_settings.lua, this head, then cache_index.lua (reachlimit/redis/_cache.py SETs the
-- entry on its own node after this, with the settings it answers). KEYS[1] the cache's
-- settings, KEYS[2] the index; ARGV[1..3] as cache_settings.lua, ARGV[4] the digest. Replies
-- {ttl (ms), stale (ms), digests evicted...}: the caller deletes those entries on their nodes.
local index, digest = KEYS[2], ARGV[4]
