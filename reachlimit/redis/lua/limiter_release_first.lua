-- Release's common case: a slot still free besides (nobody waits) and no lease ended. ARGV[4]
-- token.
if lean and held < capacity and redis.call('ZCOUNT', holders, '-inf', now) == 0 then
  return redis.call('ZREM', holders, ARGV[4])
end
