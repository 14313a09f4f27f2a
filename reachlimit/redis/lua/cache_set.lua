-- Set one entry on one Redis: cache_settings.lua, this, then cache_index.lua, then
-- cache_set_tail.lua. KEYS[1] the cache's settings, KEYS[2] the index, KEYS[3] the entry;
-- ARGV[1..3] as cache_settings.lua, ARGV[4] the entry key prefix, ARGV[5] the digest, ARGV[6]
-- the encoded value, ARGV[7] how long it took to build (ms). With a stale window the entry
-- starts with a header of its build time and its window, "t<build ms>,<stale ms>;", so that
-- whoever reads it knows when it turns stale (reachlimit/redis/_cache.py).
local index, entry = KEYS[2], KEYS[3]
local prefix, digest = ARGV[4], ARGV[5]
local value = ARGV[6]
if stale > 0 then value = 't' .. ARGV[7] .. ',' .. stale .. ';' .. value end
redis.call('SET', entry, value, 'PX', lives)
