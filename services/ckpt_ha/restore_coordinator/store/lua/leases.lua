-- The leases of a round of failures (DecisionStore.lease_many) as one command, with the
-- decision stored for each failure leased (read under its lease, as a separate read after
-- taking it would read it; one round trip instead of two). KEYS: the n failures' lease keys,
-- then their n decision keys; each lease set to the owner ARGV[1] for ARGV[2] milliseconds only
-- if nobody holds it (SET NX PX, as registry.leases.acquire). Returns, per failure, 1 when
-- taken, 0 when held, then its stored decision (nil when none, or when not taken).
local n = #KEYS / 2
local out = {}
for i = 1, n do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    out[2 * i - 1] = 1
    out[2 * i] = redis.call('GET', KEYS[n + i])
  else
    out[2 * i - 1] = 0
    out[2 * i] = false
  end
end
return out
