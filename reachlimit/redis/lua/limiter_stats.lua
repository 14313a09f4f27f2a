-- Reap, fill and read the figures. Replies {held, queued, HGETALL stats}.
return {held, queued, redis.call('HGETALL', stats)}
