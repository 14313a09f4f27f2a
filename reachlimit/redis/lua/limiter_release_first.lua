-- Release's common case: a slot still free besides (nobody waits) and no lease ended. ARGV[1]
-- token.
if held < capacity and redis.call('ZCOUNT', holders, '-inf', now) == 0 then
  return redis.call('ZREM', holders, ARGV[1])
end
