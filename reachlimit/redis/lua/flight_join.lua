-- Join a key's flight: follow the claimed one, or claim a new one. Replies {status, flight[,
-- outcome]}.
local joined = join_claimed()
if joined then return joined end
return claim(redis.call('INCR', counter))
