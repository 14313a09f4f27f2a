-- Acquire's general path, after the steps. Replies 1 granted, 0 refused (queue full), {2, ms}:
-- queued, with the milliseconds its wait lasts (the budget's wait: the waiter's deadline is
-- Redis's, and so is its length), or {7, s}: refused because its place cannot start within
-- its wait (limiter_deadline.lua), with its Retry-After in seconds.
-- A token Redis knows already: the client is retrying this call after losing its reply.
-- Answer what the first run decided (a slot handed over meanwhile is claimed here), so that
-- the token never both holds and waits and nothing is counted twice. Only here, on the
-- general path: the common cases above cannot meet a known token, but for the one written
-- down in the design note (a retry that finds every place taken).
if redis.call('ZSCORE', holders, token) then
  if redis.call('DEL', bell .. token) == 1 then redis.call('HINCRBY', stats, 'acquired', 1) end
  redis.call('ZADD', holders, now + lease_ms, token)
  return 1
end
local deadline = tonumber(redis.call('HGET', deadlines, token))
if deadline then return {2, math.max(deadline - now, 0)} end
if held < capacity then  -- after promote(), a free slot means nobody is waiting
  redis.call('ZADD', holders, now + lease_ms, token)
  redis.call('HINCRBY', stats, 'acquired', 1)
  raise_peak('peak_active', held + 1)
  return 1
end
local id = ARGV[5] or '-'  -- a bare token (none sent) is the anonymous client
if queued >= queue_cap then
  local mine = redis.call('ZCARD', of_client .. id)
  if queued < 2 * mine + 2 or not displace(mine) then
    redis.call('HINCRBY', stats, 'rejected_full', 1)
    return 0
  end
end
local ticket = redis.call('INCR', seq)
redis.call('ZADD', queue, ticket, token)
redis.call('ZADD', alive, now + presence_ms, token)
redis.call('HSET', deadlines, token, now + wait_ms)
join(token, id, ticket)
-- No wasted waits: with an estimate, a newcomer whose place cannot start within its wait is
-- refused now, {7, its Retry-After in s} (and the waiters it put behind theirs with it).
local estimate = deadline_on and tonumber(redis.call('HGET', stats, 'estimate_ms'))
if estimate then
  local retry = refuse_late(estimate, token)
  if retry then return {7, retry} end
  raise_peak('peak_queued', redis.call('ZCARD', queue))
  return {2, wait_ms}
end
raise_peak('peak_queued', queued + 1)
return {2, wait_ms}
