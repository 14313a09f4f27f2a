-- After the acquire (cold_lead_head.lua has the replies): claim the flight only for a leader
-- that will build or wait; a refused one leaves no trace of the flight.
local admitted = acquire()
if admitted == 1 or admitted == 2 then
  local reply = claim(redis.call('INCR', counter))
  reply[3] = admitted
  return reply
end
return {4, 0, admitted}
