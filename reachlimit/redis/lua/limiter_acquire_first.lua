-- Acquire's two common cases, before the general steps. ARGV[4] token, ARGV[5] client id (none:
-- the anonymous client).
-- A token given up (its caller lost the reply of an earlier call: limiter_give_up.lua) is
-- never granted or queued, also when this call reaches Redis after the give-up.
if redis.call('ZSCORE', tag .. 'gone', ARGV[4]) then return 3 end
local token = ARGV[4]
if lean then
  if held < capacity then
    if held == 0 or redis.call('ZCOUNT', holders, '-inf', now) == 0 then
      redis.call('ZADD', holders, now + lease_ms, token)
      redis.call('HINCRBY', stats, 'acquired', 1)
      -- A peak of one needs no write: any grant implies it (``stats`` reads it so).
      if held > 0 and held + 1 > (tonumber(redis.call('HGET', stats, 'peak_active')) or 0) then
        redis.call('HSET', stats, 'peak_active', held + 1)
      end
      return 1
    end
  elseif redis.call('ZCOUNT', holders, '-inf', now) == 0
      and redis.call('ZCOUNT', alive, '(' .. now, '+inf') >= queue_cap
      and queue_cap < 2 * redis.call('ZCARD', of_client .. (ARGV[5] or '-')) + 2 then
    redis.call('HINCRBY', stats, 'rejected_full', 1)
    return 0
  end
end
