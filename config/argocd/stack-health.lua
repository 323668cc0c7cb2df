-- Argo CD health of a terrace.dev Stack, from its kstatus conditions.
hs = { status = "Progressing", message = "Waiting for the Terrace controller" }
if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "Stack is suspended: terrace resume " .. obj.metadata.name
  return hs
end
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local ready, stalled, reconciling
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then ready = c end
  if c.type == "Stalled" then stalled = c end
  if c.type == "Reconciling" then reconciling = c end
end
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. stalled.message
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Generation " .. generation .. " not yet reconciled"
  if reconciling ~= nil and reconciling.status == "True" then hs.message = reconciling.message end
  return hs
end
if ready == nil then
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
if ready.reason == "AwaitingApproval" then
  -- A person must approve the plan: not a failure, not progress either.
  hs.status = "Suspended"
  hs.message = ready.message
  return hs
end
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = reconciling.message
  return hs
end
hs.status = "Degraded"
hs.message = ready.reason .. ": " .. ready.message
return hs
