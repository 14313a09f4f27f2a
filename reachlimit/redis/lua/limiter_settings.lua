-- The budget's settings, read from Redis: its settings hash (KEYS[9]), which every process
-- writes when it starts using the budget, the newest start winning (limiter_record.lua). The
-- text of every script is the same for every budget; no setting is written into it.
--
-- ARGV[1] this process's presence period (ms: not a budget setting, each process has its own),
-- ARGV[2] its lease (ms), ARGV[3] "<active> <queue> <wait ms> <deadline 0/1>", its other
-- settings (one argument, parsed only when needed). They are used for any setting the hash lacks (Redis
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
local recorded = redis.call('HMGET', settings, 'active', 'queue', 'wait_ms', 'lease_ms',
                            'deadline')
local capacity, queue_cap = tonumber(recorded[1]), tonumber(recorded[2])
local wait_ms, lease_ms = tonumber(recorded[3]), tonumber(recorded[4])
local deadline_on = tonumber(recorded[5])  -- no wasted waits (limiter_deadline.lua): 1 on
if not (capacity and queue_cap and wait_ms and lease_ms and deadline_on) then
  local names = {'active', 'queue', 'wait_ms', 'lease_ms', 'deadline'}
  local mine_active, mine_queue, mine_wait, mine_deadline =
      string.match(ARGV[3], '^(%d+) (%d+) (%d+) (%d+)$')
  local own = {mine_active, mine_queue, mine_wait, ARGV[2], mine_deadline}
  for i = 1, 5 do
    if tonumber(recorded[i]) then
      recorded[i] = tonumber(recorded[i])
    else
      recorded[i] = tonumber(own[i])
      if record then redis.call('HSET', settings, names[i], own[i]) end
    end
  end
  capacity, queue_cap, wait_ms, lease_ms = recorded[1], recorded[2], recorded[3], recorded[4]
  deadline_on = recorded[5]
  lean = false
end
deadline_on = deadline_on == 1
lease_ms = math.max(lease_ms, tonumber(ARGV[2]))
