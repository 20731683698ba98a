#!lua name=farm
-- Publication of decisions under the farm's replacement rule (mirrors farm.stores.base.replaces): a verified record
-- beats an unverified one, otherwise the newer one (by `created`) wins, a tie going to the newcomer.
--
-- farm_publish: decisions of one fingerprint, each as if published alone, in order, and all in one atomic call:
-- replace it under the rule, index the problem, remember the fingerprint text and append an update event. The
-- store's one publication (farm.stores.redis.RedisDecisions.publish_batch): the coordinator's decisions and an
-- archive import's alike, up to a thousand per call.
-- KEYS: 1 decisions hash of the fingerprint, 2 problems hash of the fingerprint, 3 fingerprints hash, 4 events stream,
--       5 trials hash of the fingerprint, then the fence key of each fenced decision, in order
-- ARGV: 1 fingerprint digest, 2 fingerprint text, 3 events stream max length, then per decision 9 values:
--       field (sha256 of the cache key), record JSON, problem id ('' for none), trials JSON ('' for none), then the
--       record's own fields, so that the record is stored as it is, never decoded here: verified ('true' or
--       'false'), created (a number as Python's repr writes it), winner (its name), run (meta.run as the event
--       shows it), and the value its fence key must hold ('' for an unfenced decision).
-- Returns the reason of each decision, joined by newlines: 'new' or 'replaced...' (it was written), 'kept: ...' or
-- 'refused: ...' (it was not).
--
-- Fencing: a fenced decision is refused unless its fence key (a coordinator's lease) holds exactly the value given;
-- a publication consumes the lease, so a stale coordinator, or a retried call, can never publish twice.
-- The stored record compared with is validated first: a malformed one (not an object, `verified` not a
-- boolean, `created` not a finite number up to a day ahead of the server's clock) is replaced, and the event
-- says so.

local function malformed(old_raw)
  local ok, old = pcall(cjson.decode, old_raw)
  if not ok then return 'unreadable JSON', nil end
  if type(old) ~= 'table' then return 'not an object', nil end
  if type(old['verified']) ~= 'boolean' then return 'verified is not a boolean', nil end
  local created = old['created']
  if type(created) ~= 'number' or created ~= created or created == math.huge or created == -math.huge then
    return 'created is not a finite number', nil
  end
  local now = tonumber(redis.call('TIME')[1])
  if created > now + 86400 then return 'created is in the future', nil end
  return nil, old
end

-- Whether a record (verified, created) replaces one stored as (old_verified, old_created), and why.
local function outranks(verified, created, old_verified, old_created)
  if old_verified ~= verified then
    if not verified then return false, 'kept: a verified record beats an unverified one' end
    return true, 'replaced: verified beats unverified'
  elseif tonumber(created) < old_created then
    return false, 'kept: the stored record is newer'
  end
  return true, 'replaced: newer run'
end

-- Whether a new record (verified, created) replaces the stored one (old_raw, nil for none), and why.
local function judge(old_raw, verified, created)
  if not old_raw then return true, 'new' end
  local problem_text, old = malformed(old_raw)
  if problem_text then return true, 'replaced malformed record (' .. problem_text .. ')' end
  return outranks(verified, created, old['verified'], old['created'])
end

-- HSET key with the (field, value) pairs of `pairs` (a flat list), a thousand pairs per command.
local function hset_all(key, pairs)
  for i = 1, #pairs, 2000 do
    redis.call('HSET', key, unpack(pairs, i, math.min(i + 1999, #pairs)))
  end
end

local function publish(keys, args)
  local digest, text, maxlen = args[1], args[2], args[3]
  local fields = {}
  for i = 4, #args, 9 do fields[#fields + 1] = args[i] end
  if #fields == 0 then return '' end
  local stored = {}
  for i = 1, #fields, 1000 do
    local olds = redis.call('HMGET', keys[1], unpack(fields, i, math.min(i + 999, #fields)))
    for j = 1, #olds do stored[i + j - 1] = olds[j] end
  end
  local written = {}  -- field -> the argument offset of the last record this call wrote for it (a key published twice)
  local records, problems, events, out = {}, {}, {}, {}
  local trial_rows, order = {}, {}  -- field -> its last winner's trials JSON ('' for none), fields in order
  local fence = 5
  for j = 1, #fields do
    local i = 4 + 9 * (j - 1)
    local field, verified, created = args[i], args[i + 4] == 'true', args[i + 5]
    local wins, reason
    local lease = args[i + 8]
    if lease ~= '' then
      fence = fence + 1
      local holder = redis.call('GET', keys[fence])
      if holder ~= lease then
        wins, reason = false, 'refused: stale lease (held by ' .. tostring(holder or 'nobody') .. ')'
      end
    end
    if not reason then
      local earlier = written[field]
      if earlier then
        wins, reason = outranks(verified, created, args[earlier + 4] == 'true', tonumber(args[earlier + 5]))
      else
        wins, reason = judge(stored[j] or nil, verified, created)
      end
      if lease ~= '' then redis.call('DEL', keys[fence]) end
    end
    if wins then
      written[field] = i
      records[#records + 1] = field
      records[#records + 1] = args[i + 1]
      if trial_rows[field] == nil then order[#order + 1] = field end
      trial_rows[field] = args[i + 3]
      if args[i + 2] ~= '' then
        problems[#problems + 1] = args[i + 2]
        problems[#problems + 1] = field
      end
      events[#events + 1] = i
      events[#events + 1] = reason
    end
    out[#out + 1] = reason
  end
  if #records > 0 then
    hset_all(keys[1], records)
    local trials, untried = {}, {}
    for _, field in ipairs(order) do
      if trial_rows[field] ~= '' then
        trials[#trials + 1] = field
        trials[#trials + 1] = trial_rows[field]
      else
        untried[#untried + 1] = field
      end
    end
    hset_all(keys[5], trials)
    for i = 1, #untried, 1000 do
      redis.call('HDEL', keys[5], unpack(untried, i, math.min(i + 999, #untried)))
    end
    hset_all(keys[2], problems)
    redis.call('HSET', keys[3], digest, text)
    for e = 1, #events, 2 do
      local i = events[e]
      redis.call('XADD', keys[4], 'MAXLEN', '~', maxlen, '*', 'fingerprint', digest, 'field', args[i],
        'winner', args[i + 6], 'verified', args[i + 4], 'run', args[i + 7], 'reason', events[e + 1])
    end
  end
  return table.concat(out, '\n')
end

redis.register_function('farm_publish', publish)
