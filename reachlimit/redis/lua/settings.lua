-- Record a budget's settings, or read the ones recorded: the first process to use a budget
-- writes them, every other one compares its own (reachlimit/redis/_common.py,
-- check_settings). KEYS[1] the settings hash; ARGV name, value, name, value...
-- Replies HGETALL of the hash after the writes (field, value, field, value...).
for i = 1, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
return redis.call('HGETALL', KEYS[1])
