-- wrk script: every write carries 16 pipelined GET requests.
local depth = 16
init = function(args)
  local r = {}
  for i = 1, depth do
    r[i] = wrk.format(nil, wrk.path)
  end
  req = table.concat(r)
end
request = function()
  return req
end
