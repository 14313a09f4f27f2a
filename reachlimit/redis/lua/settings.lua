-- Record the settings of a process that starts using a shared object (a RedisCache: its ttl,
-- stale window and size), the newest start winning: every field is written, whatever was there
-- (reachlimit/redis/_common.py, record_settings). KEYS[1] the settings hash; ARGV[1] who writes
-- (the process's owner id), ARGV[2..] name, value, name, value... Replies what was recorded
-- before: {who, value of each name given}, nil for each one that was not.
local names = {'by'}
for i = 2, #ARGV, 2 do names[#names + 1] = ARGV[i] end
local before = redis.call('HMGET', KEYS[1], unpack(names))
redis.call('HSET', KEYS[1], 'by', unpack(ARGV))
return before
