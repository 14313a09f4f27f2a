-- A timed grant (one a waiter was promoted to: its promotion time is in ``since``, written by
-- promote() in limiter_steps.lua) has just been released: record how long it held its slot in
-- ``durations`` (the latest 16, newest first), and the budget's estimate of build time from
-- them in the stats hash (``estimate_ms``): the ((n - 1) // 4)-th smallest of n, none before 4
-- (reachlimit._limiter's ESTIMATE_AFTER and ESTIMATE_SAMPLES; its design note says why a low
-- percentile). Whatever the build returned or raised: its slot was held all the same.
local function took(token)
  local started = tonumber(redis.call('HGET', since, token))
  if not started then return end
  redis.call('HDEL', since, token)
  redis.call('LPUSH', durations, math.max(0, now - started))
  redis.call('LTRIM', durations, 0, 15)
  local times = redis.call('LRANGE', durations, 0, -1)
  if #times >= 4 then
    for i = 1, #times do times[i] = tonumber(times[i]) end
    table.sort(times)
    redis.call('HSET', stats, 'estimate_ms', times[math.floor((#times - 1) / 4) + 1])
  end
end
