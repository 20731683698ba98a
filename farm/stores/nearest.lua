-- The nearest-decision lookup (farm.stores.redis_nearest), appended to the "farm" library of publish.lua when it is
-- loaded: the same library, one FUNCTION LOAD.
--
-- farm_nearest (read only): the fields of a family's nearest decisions, nearest first.
-- KEYS: 1 the family's sorted set (members '<dims JSON>|<field>', scored by log2 of the first dimension).
-- ARGV: 1 lowest score, 2 highest score (the window), 3 the query's score, 4 the largest distance, 5 how many,
--       6.. the query's dimensions.
-- The distance is farm.nearest's: the largest per-dimension |log2 a - log2 b| (a zero is near only a zero); ties go
-- to the smaller sum of per-dimension distances, then the smaller field. Members are read outward from the query's
-- score, 64 at a time on each side, nearest score first (a lower bound of their distance), until that bound exceeds
-- the distance of the last one kept: a lookup reads the few members near the query, not the whole window.

local function gap(a, b)
  if a == b then return 0 end
  if a <= 0 or b <= 0 then return math.huge end
  return math.abs(math.log(a) - math.log(b)) / math.log(2)
end

local function before(x, y)
  if x[1] ~= y[1] then return x[1] < y[1] end
  if x[2] ~= y[2] then return x[2] < y[2] end
  return x[3] < y[3]
end

-- One side of the window, read in batches as it is consumed: members from the query's score outward.
local function cursor(key, from, to, reverse)
  local c = {buffer = {}, at = 1, offset = 0, done = false}
  function c.peek()
    if c.at > #c.buffer and not c.done then
      local command = reverse and 'ZREVRANGEBYSCORE' or 'ZRANGEBYSCORE'
      c.buffer = redis.call(command, key, from, to, 'WITHSCORES', 'LIMIT', c.offset, 64)
      c.at, c.offset = 1, c.offset + 64
      c.done = #c.buffer < 128
    end
    if c.at > #c.buffer then return nil end
    return c.buffer[c.at], tonumber(c.buffer[c.at + 1])
  end
  function c.next() c.at = c.at + 2 end
  return c
end

local function nearest(keys, args)
  local here, reach, limit = tonumber(args[3]), tonumber(args[4]), tonumber(args[5])
  local query = {}
  for i = 6, #args do query[#query + 1] = tonumber(args[i]) end
  local up = cursor(keys[1], args[3], args[2], false)
  local down = cursor(keys[1], '(' .. args[3], args[1], true)
  local best = {}
  while true do
    local m1, s1 = up.peek()
    local m2, s2 = down.peek()
    if m1 == nil and m2 == nil then break end
    local member, bound
    if m2 == nil or (m1 ~= nil and s1 - here <= here - s2) then
      member, bound = m1, s1 - here
      up.next()
    else
      member, bound = m2, here - s2
      down.next()
    end
    if #best >= limit and bound > best[limit][1] + 1e-9 then break end
    local dims, field = string.match(member, '^%[([^%]]*)%]|(.+)$')
    if dims ~= nil then
      local values = {}
      for v in string.gmatch(dims, '%d+') do values[#values + 1] = tonumber(v) end
      if #values == #query then
        local worst, sum = 0, 0
        for i = 1, #query do
          local g = gap(values[i], query[i])
          if g > worst then worst = g end
          sum = sum + g
        end
        if worst <= reach then
          best[#best + 1] = {worst, sum, field}
          table.sort(best, before)
          if #best > limit then table.remove(best) end
        end
      end
    end
  end
  local fields = {}
  for i = 1, #best do fields[i] = best[i][3] end
  return fields
end

redis.register_function{function_name = 'farm_nearest', callback = nearest, flags = {'no-writes'}}
