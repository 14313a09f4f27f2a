-- After the acquire (cold_lead_head.lua has the replies): claim the flight only for a leader
-- that will build or wait; a refused one leaves no trace of the flight.
local admitted, left = acquire(), 0
if type(admitted) == 'table' then admitted, left = admitted[1], admitted[2] end
if admitted == 1 or admitted == 2 then
  local reply = claim(redis.call('INCR', counter))
  reply[3] = admitted
  reply[4] = left
  return reply
end
return {4, 0, admitted, left}  -- a deadline refusal's Retry-After (s) in ``left``
