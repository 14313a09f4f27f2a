-- Empty a cache: every entry in its index, then the index. KEYS[1] the index; ARGV[1] the
-- entry key prefix. Replies how many entries were deleted. (An entry evicted from the index
-- under an allkeys-* policy is not found here; it ends with its own TTL.)
local deleted = 0
for _, digest in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  deleted = deleted + redis.call('DEL', ARGV[1] .. digest)
end
redis.call('DEL', KEYS[1])
return deleted
