-- Publish an outcome. ARGV[5] the flight, ARGV[6] the outcome, ARGV[7] outcome ttl (ms).
local n = ARGV[5]
local first = redis.call('SET', base .. 'out:' .. n, ARGV[6], 'PX', tonumber(ARGV[7]), 'NX')
if redis.call('GET', lead) == n .. ':' .. token then redis.call('DEL', lead) end
redis.call('PEXPIRE', counter, keep)
if not first then return 0 end
local waiting = tonumber(redis.call('GET', base .. 'w:' .. n)) or 0
redis.call('DEL', base .. 'w:' .. n)
local bell = base .. 'bell:' .. n
for _ = 1, waiting do redis.call('RPUSH', bell, 1) end
if waiting > 0 then redis.call('PEXPIRE', bell, tonumber(ARGV[7])) end
return 1
