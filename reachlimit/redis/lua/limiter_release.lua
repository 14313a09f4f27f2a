-- Release's general path. ARGV[4] token. Replies 1 if the slot was still this grant's, else 0.
local mine = redis.call('ZREM', holders, ARGV[4])
if mine == 1 then
  held = held - 1
  promote()
end
return mine
