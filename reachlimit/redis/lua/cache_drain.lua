-- Empty a cache's index on a Redis Cluster (its entries live on other slots: the caller
-- deletes them there). KEYS[1] the index. Replies every digest it held.
local digests = redis.call('ZRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return digests
