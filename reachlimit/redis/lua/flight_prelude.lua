-- Common to the flight scripts: KEYS[1] F:lead, KEYS[2] F:n; ARGV[1] the key base "F:", ARGV[2]
-- our token, ARGV[3] lease (ms), ARGV[4] how long the counter outlives the last write (ms).
-- Counted from K and A (0 and 0 in the flight's own scripts; the cold lead, whose limiter
-- keys and arguments come first, sets them further on): KEYS[K + 1], ARGV[A + 1], ...
local lead, counter = KEYS[K + 1], KEYS[K + 2]
local base, token = ARGV[A + 1], ARGV[A + 2]
local lease, keep = tonumber(ARGV[A + 3]), tonumber(ARGV[A + 4])

local function flight_of(claim)
  return tonumber(string.match(claim, '^(%d+):'))
end

-- The claim, or nil; a claim that is not ours to read (corrupt) is dropped, as if it ended.
local function read_claim()
  local claim = redis.call('GET', lead)
  if claim and not flight_of(claim) then
    redis.call('DEL', lead)
    return nil
  end
  return claim
end

local function outcome(n)
  return redis.call('GET', base .. 'out:' .. n)
end

local function follow(n)
  redis.call('INCR', base .. 'w:' .. n)
  redis.call('PEXPIRE', base .. 'w:' .. n, keep)
  return {1, n}
end

local function claim(n)
  redis.call('SET', lead, n .. ':' .. token, 'PX', lease)
  redis.call('PEXPIRE', counter, keep)
  return {0, n}
end

-- The join's answer when a flight is claimed: take its outcome if it has one, else follow it
-- (counted in its followers). nil when no flight is claimed.
local function join_claimed()
  local current = read_claim()
  if not current then return nil end
  local n = flight_of(current)
  local out = outcome(n)
  if out then return {2, n, out} end
  return follow(n)
end
