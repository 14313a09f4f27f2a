-- A follower's check. ARGV[5] the flight we follow. Replies {status, flight[, outcome]}.
local mine = tonumber(ARGV[5])
local out = outcome(mine)
if out then return {2, mine, out} end
local current = read_claim()
if current then
  local n = flight_of(current)
  if n == mine then return {1, mine} end
  out = outcome(n)
  if out then return {2, n, out} end
  return follow(n)
end
local latest = tonumber(redis.call('GET', counter))
if not latest then  -- Redis lost the counter (emptied): start over past our number
  redis.call('SET', counter, mine + 1)
  return claim(mine + 1)
end
if latest ~= mine then
  out = outcome(latest)
  if out then return {2, latest, out} end
end
return claim(latest)  -- its leader is gone: take the flight over, same number
