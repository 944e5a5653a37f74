-- A job's attention record (AttentionStore.attend / settle): written, or cleared (ARGV[3] is
-- ''), only by an event of the same or a later time than the one stored, so that events two
-- consumers handle out of order never bring back a state that ended or end one that came
-- after. KEYS[1]: the attention hash. ARGV: job, unix time of the event, the value, and for a
-- clear the one status it ends ('' any).
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local at, status = string.match(old, '^([^|]*)|([^|]*)')
  if tonumber(at) > tonumber(ARGV[2]) then return 0 end
  if ARGV[3] == '' and ARGV[4] ~= '' and status ~= ARGV[4] then return 0 end
elseif ARGV[3] == '' then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
