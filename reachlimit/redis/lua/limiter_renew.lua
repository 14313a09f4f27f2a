-- Renew leases. ARGV[4..] tokens. Replies the tokens no longer held.
local lost = {}
for i = 4, #ARGV do
  if redis.call('ZSCORE', holders, ARGV[i]) then
    redis.call('ZADD', holders, now + lease_ms, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
