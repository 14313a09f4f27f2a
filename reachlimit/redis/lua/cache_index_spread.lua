-- The index step of a set on a Redis Cluster, where entries spread over slots (the entry is
-- SET on its own node first; reachlimit/redis/_cache.py): this head, then cache_index.lua.
-- KEYS[1] the index; ARGV[1] the digest, ARGV[2] ttl (ms), ARGV[3] size. Replies the
-- digests evicted, whose entries the caller deletes on their nodes.
local index, digest = KEYS[1], ARGV[1]
local ttl, size = tonumber(ARGV[2]), tonumber(ARGV[3])
