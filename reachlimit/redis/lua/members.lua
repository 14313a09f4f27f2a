-- The live processes of one budget (reachlimit/redis/_members.py): each process using the
-- budget with an in-process fallback announces itself every second or so, and a process that
-- stops announcing drops out one period after its last announce. No key but the two it is
-- given (KEYS).
--
-- KEYS[1]  T:members   ZSET  member id -> when its period ends (ms, Redis time)
-- KEYS[2]  T:holders   ZSET  the limiter's slots held (limiter.lua), for ARGV[3] only
-- ARGV[1]  with a period: the announcing member's id ("<host>:<boot id>:<pid>:<random>");
--          with "0": the start of the ids to remove (a member's own id when it closes, or
--          "<host>:<boot id>:<pid>:" for every member of a process that died)
-- ARGV[2]  the period (ms): the member is live until now + period; "0": leave instead
-- ARGV[3]  "1": the announcing member uses Redis now (it is on no fallback), so a
--          reservation of its share that another member's recovery made (holders
--          "#<member id>#<i>": limiter.lua's Reservations) has no reason left and is dropped
--
-- Replies {how many members are live after the call (the announcing one included), 1 if the
-- announcing member was not among them before (its first announce, or Redis lost it: its
-- period ended, or Redis restarted empty), else 0}.
local members, who, period = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', members, '-inf', now)  -- their period ended: gone
local added = 0
if period > 0 then
  added = redis.call('ZADD', members, now + period, who)
  if ARGV[3] == '1' and KEYS[2] then
    local mine = '#' .. who .. '#'
    for _, holder in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')) do
      if string.sub(holder, 1, #mine) == mine then redis.call('ZREM', KEYS[2], holder) end
    end
  end
  -- The key outlives its last member by nothing: a budget nobody uses leaves no key behind.
  if redis.call('PTTL', members) < period then
    redis.call('PEXPIRE', members, period)
  end
else
  local n = #who
  for _, id in ipairs(redis.call('ZRANGE', members, 0, -1)) do
    if string.sub(id, 1, n) == who then
      redis.call('ZREM', members, id)
    end
  end
end
return {redis.call('ZCARD', members), added}
