-- Argo CD health of a terrace.dev Program: Ready when its artifact is served.
hs = { status = "Progressing", message = "Waiting for the Terrace controller" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = c.reason .. ": " .. c.message
    return hs
  end
end
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Generation " .. generation .. " not yet reconciled"
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    if c.status == "True" then
      hs.status = "Healthy"
    elseif c.reason ~= "Progressing" then
      hs.status = "Degraded"
    end
    hs.message = c.message
  end
end
return hs
