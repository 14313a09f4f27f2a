-- Give up the tokens of calls whose replies were lost (a socket timeout after the script ran):
-- each slot one of them holds is freed and each queue place left, and each is remembered as
-- gone for a while, so that a call of it still on its way (sent on a timed-out connection)
-- is refused when it arrives (limiter_acquire_first.lua). Idempotent. ARGV[4] how long a
-- token is remembered (ms), ARGV[5..] the tokens. Replies {slots freed, places left}.
local gone = tag .. 'gone'
local remember = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
local freed, left = 0, 0
for i = 5, #ARGV do
  local token = ARGV[i]
  if redis.call('ZREM', holders, token) == 1 then freed = freed + 1 end
  redis.call('HDEL', since, token)
  if redis.call('ZSCORE', queue, token) then
    forget_waiter(token)
    left = left + 1
  end
  redis.call('DEL', bell .. token)
  redis.call('ZADD', gone, now + remember, token)
end
redis.call('PEXPIRE', gone, remember)
fill()
return {freed, left}
