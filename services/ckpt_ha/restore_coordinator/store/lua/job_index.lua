-- A fetched batch's events into the job index (RedisJobIndex.record) as one command, instead
-- of a pipelined ZADD per job whose replies the client parsed one by one. Formats no key:
-- KEYS[1] is every job's sorted set, KEYS[1 + i] job i's log. ARGV, per job in KEYS' order:
-- its id, its first place in the batch, the number n of its events, then n (place, event)
-- pairs. Each ZADD is NX: an event (or a job) heard again keeps its first place.
local a = 1
for i = 2, #KEYS do
  local job, first, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  redis.call('ZADD', KEYS[1], 'NX', first, job)
  redis.call('ZADD', KEYS[i], 'NX', unpack(ARGV, a + 3, a + 2 + 2 * n))
  a = a + 3 + 2 * n
end
return #KEYS - 1
