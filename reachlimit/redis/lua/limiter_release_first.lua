-- Release's common case: a slot still free besides (nobody waits) and no lease ended. ARGV[4]
-- token, ARGV[5] "t" for a timed grant (one a waiter was promoted to: limiter_took.lua).
if lean and held < capacity and redis.call('ZCOUNT', holders, '-inf', now) == 0 then
  if ARGV[5] and redis.call('ZSCORE', holders, ARGV[4]) then took(ARGV[4]) end
  return redis.call('ZREM', holders, ARGV[4])
end
