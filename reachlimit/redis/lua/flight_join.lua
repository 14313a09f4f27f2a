-- Join a key's flight: follow the claimed one, or claim a new one. Replies {status, flight[,
-- outcome]}.
local current = read_claim()
if current then
  local n = flight_of(current)
  local out = outcome(n)
  if out then return {2, n, out} end
  return follow(n)
end
return claim(redis.call('INCR', counter))
