-- The leases of a round of failures (DecisionStore.lease_many) as one command: each KEYS[i]
-- set to the owner ARGV[1] for ARGV[2] milliseconds only if nobody holds it (SET NX PX, as
-- registry.leases.acquire). Returns, per key, 1 when taken, 0 when held.
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('SET', k, ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
end
return out
