-- Reap, fill and read the figures, with the budget's settings as Redis holds them. Replies
-- {held, queued, HGETALL stats, {active, queue, wait (ms)}}.
return {held, queued, redis.call('HGETALL', stats), {capacity, queue_cap, wait_ms}}
