-- Trajectory points of a round of failures (ProgressStore.points_at) as one command: field
-- ARGV[i] (a step) of the hash KEYS[i] (a job's trajectory); false where there is none.
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('HGET', k, ARGV[i])
end
return out
