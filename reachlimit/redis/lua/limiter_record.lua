-- A process starts using the budget (RedisColdLimiter's first call): its settings replace the
-- ones recorded, the newest start winning, and the steps that follow (limiter_settings.lua,
-- then the general steps) reap and fill under them, so that a budget given more slots promotes
-- its waiters in this same script (the rule of limiter_steps.lua holds). KEYS as every limiter
-- script; ARGV[1..3] as limiter_settings.lua, ARGV[4] who writes (the process's owner id).
-- Replies what was recorded before: {who, active, queue, wait (ms), lease (ms), deadline (0/1)},
-- nil for each one that was not.
local before = redis.call('HMGET', settings, 'by', 'active', 'queue', 'wait_ms', 'lease_ms',
                          'deadline')
local mine_active, mine_queue, mine_wait, mine_deadline =
    string.match(ARGV[3], '^(%d+) (%d+) (%d+) (%d+)$')
redis.call('HSET', settings, 'by', ARGV[4], 'active', mine_active, 'queue', mine_queue,
           'wait_ms', mine_wait, 'lease_ms', ARGV[2], 'deadline', mine_deadline)
