-- Free every slot and place of one owner. ARGV[4] the owner prefix. Replies {slots freed, places
-- removed}.
local owner = ARGV[4]
local n = #owner
local freed, dropped = 0, 0
for _, token in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
  if string.sub(token, 1, n) == owner then
    redis.call('ZREM', holders, token)
    redis.call('HDEL', since, token)
    redis.call('DEL', bell .. token)
    freed = freed + 1
  end
end
for _, token in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  if string.sub(token, 1, n) == owner then
    forget_waiter(token)
    redis.call('DEL', bell .. token)
    dropped = dropped + 1
  end
end
fill()
return {freed, dropped}
