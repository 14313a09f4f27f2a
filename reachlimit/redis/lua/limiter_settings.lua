-- The budget's settings, read from Redis: its settings hash (KEYS[9]), which every process
-- writes when it starts using the budget, the newest start winning (limiter_record.lua). The
-- text of every script is the same for every budget; no setting is written into it.
--
-- ARGV[1] this process's presence period (ms: not a budget setting, each process has its own),
-- ARGV[2] its lease (ms), ARGV[3] "<active> <queue> <wait ms>", its other settings (one
-- argument, parsed only when needed). They are used for any setting the hash lacks (Redis
-- restarted empty, the key evicted, a field that is not a number), and then written back (when
-- `record`), so a script never fails for want of its settings and the first process to notice
-- re-creates the hash. `record` is false only in the release of a dead process's places
-- (limiter_release_owner.lua), run by a parent that is no process of the budget: it uses its
-- figures, it does not record them. After a setting was missing, `lean` is off for this call
-- (the rule of limiter_steps.lua may not hold against a setting just changed).
--
-- A grant's lease is the budget's, or its holder's own when that is longer: a process renews
-- its grants every third of its own lease, so they must outlast that.
local presence_ms = tonumber(ARGV[1])
local recorded = redis.call('HMGET', settings, 'active', 'queue', 'wait_ms', 'lease_ms')
local capacity, queue_cap = tonumber(recorded[1]), tonumber(recorded[2])
local wait_ms, lease_ms = tonumber(recorded[3]), tonumber(recorded[4])
if not (capacity and queue_cap and wait_ms and lease_ms) then
  local names = {'active', 'queue', 'wait_ms', 'lease_ms'}
  local own = {string.match(ARGV[3], '^(%d+) (%d+) (%d+)$')}
  own[4] = ARGV[2]
  for i = 1, 4 do
    if tonumber(recorded[i]) then
      recorded[i] = tonumber(recorded[i])
    else
      recorded[i] = tonumber(own[i])
      if record then redis.call('HSET', settings, names[i], own[i]) end
    end
  end
  capacity, queue_cap, wait_ms, lease_ms = recorded[1], recorded[2], recorded[3], recorded[4]
  lean = false
end
lease_ms = math.max(lease_ms, tonumber(ARGV[2]))
