-- The hot scripts answer their common cases before the general steps (whose functions Lua
-- would otherwise build on every call): each such case is one where those steps would find
-- nothing to reap and nobody to promote, and it makes the same calls they would have made.
-- Acquire, sent while this limiter's last acquire was refused: the refusal first. ARGV[4] token,
-- ARGV[5] client id.
if redis.call('ZCOUNT', holders, '(' .. now, '+inf') >= capacity
    and redis.call('ZCOUNT', alive, '(' .. now, '+inf') >= queue_cap
    and queue_cap < 2 * redis.call('ZCARD', of_client .. (ARGV[5] or '-')) + 2 then
  redis.call('HINCRBY', stats, 'rejected_full', 1)
  return 0
end
