-- A waiter's poll. ARGV[4] token, ARGV[5] 0 stay / 1 give up (cancelled) / 2 abandon (error).
-- Replies {outcome, ms left}; refused late (limiter_deadline.lua), {7, its Retry-After in s}.
local token = ARGV[4]
local leaving = tonumber(ARGV[5])
if redis.call('ZSCORE', holders, token) then
  redis.call('DEL', bell .. token)
  if leaving ~= 0 then  -- promoted at the instant we gave up: pass the slot on
    redis.call('ZREM', holders, token)
    redis.call('HDEL', since, token)
    held = held - 1
    if leaving == 1 then redis.call('HINCRBY', stats, 'cancelled', 1) end
    promote()
    return {4, 0}
  end
  redis.call('ZADD', holders, now + lease_ms, token)
  redis.call('HINCRBY', stats, 'acquired', 1)
  return {1, 0}
end
if not redis.call('ZSCORE', queue, token) then  -- displaced, late, dropped or Redis emptied
  local rung = redis.call('LPOP', bell .. token)
  if rung == 'd' then  -- counted by its displacer
    redis.call('DEL', bell .. token)
    return {6, 0}
  end
  if rung and string.sub(rung, 1, 1) == 'l' then  -- refused late: counted by its refuser
    redis.call('DEL', bell .. token)
    return {7, tonumber(string.sub(rung, 2)) or 1}
  end
  redis.call('DEL', bell .. token)
  if leaving == 0 then redis.call('HINCRBY', stats, 'rejected_timeout', 1) end
  if leaving == 1 then redis.call('HINCRBY', stats, 'cancelled', 1) end
  return {5, 0}
end
if leaving ~= 0 then
  forget_waiter(token)
  redis.call('DEL', bell .. token)
  if leaving == 1 then redis.call('HINCRBY', stats, 'cancelled', 1) end
  return {4, 0}
end
-- A deadline that is gone (evicted under an allkeys-* policy) ends the wait now: a timeout,
-- never a script error (which would be taken for Redis failing).
local remaining = (tonumber(redis.call('HGET', deadlines, token)) or now) - now
if remaining <= 0 then
  forget_waiter(token)
  redis.call('DEL', bell .. token)
  redis.call('HINCRBY', stats, 'rejected_timeout', 1)
  return {3, 0}
end
redis.call('ZADD', alive, now + presence_ms, token)
return {2, remaining}
