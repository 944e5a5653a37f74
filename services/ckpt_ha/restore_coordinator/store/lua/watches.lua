-- Compare-and-set of a batch's watches (WatchStore.update_watches): writes only if every
-- watch is still exactly what the caller read, else returns 0 (the caller reads again and
-- retries, as a WATCH transaction would). It decides nothing: the writes are what the Python
-- rules computed. Formats no key: KEYS are the batch's watches, then the heard and the due
-- sorted sets. ARGV[1]: seconds an ended watch lives (0: no expiry: a replay notes it);
-- ARGV[2]: JSON {"expect": [SHA-1 of what each watch held, '' for none], "ended": [[i, doc]...],
-- "kept": [[i, doc]...], "unheard": [...], "undue": [...], "due": [[job, time]...]}
-- (i: the watch's place in KEYS).
local ttl, n = tonumber(ARGV[1]), #KEYS - 2
local w = cjson.decode(ARGV[2])
for i = 1, n do
  local current = redis.call('GET', KEYS[i])
  if (current and redis.sha1hex(current) or '') ~= w.expect[i] then return 0 end
end
local CHUNK = 1000
local function chunked(cmd, key, args)
  for i = 1, #args, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, #args)))
  end
end
for _, e in ipairs(w.ended) do
  if ttl > 0 then
    redis.call('SET', KEYS[e[1]], e[2], 'EX', ttl)
  else
    redis.call('SET', KEYS[e[1]], e[2])
  end
end
for _, e in ipairs(w.kept) do redis.call('SET', KEYS[e[1]], e[2]) end
chunked('ZREM', KEYS[n + 1], w.unheard)
chunked('ZREM', KEYS[n + 2], w.undue)
local scored = {}
for _, d in ipairs(w.due) do
  scored[#scored + 1] = d[2]
  scored[#scored + 1] = d[1]
end
chunked('ZADD', KEYS[n + 2], scored)
return 1
