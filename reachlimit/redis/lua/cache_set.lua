-- Set one entry on one Redis: this head, then cache_index.lua, then cache_set_tail.lua.
-- KEYS[1] the index, KEYS[2] the entry; ARGV[1] the entry key prefix, ARGV[2] the digest,
-- ARGV[3] the encoded value, ARGV[4] ttl (ms), ARGV[5] size.
local index, entry = KEYS[1], KEYS[2]
local prefix, digest = ARGV[1], ARGV[2]
local ttl, size = tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('SET', entry, ARGV[3], 'PX', ttl)
