// Terrace console: a small page over the Installations API's Connect JSON
// endpoints. The bearer token lives in sessionStorage only (gone with the
// tab); every request carries it, so the Kubernetes API decides. Data is
// put on the page with textContent only, never as HTML.
"use strict";

const service = "/terrace.api.v1.InstallationService/";
const tokenKey = "terrace.token";
const serverNamespace = document.body.dataset.namespace;
const oidcEnabled = document.body.dataset.oidc === "true";
const phases = ["Ready", "AwaitingApproval", "Planning", "Applying", "Failed", "Pending", "Deleting"];

let cleanup = []; // what the current view must stop when left

class APIError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

function token() { return sessionStorage.getItem(tokenKey); }

async function call(method, body, signal) {
  const res = await fetch(service + method, {
    method: "POST", signal,
    headers: { "Content-Type": "application/json", "Connect-Protocol-Version": "1", "Authorization": "Bearer " + token() },
    body: JSON.stringify(body || {}),
  });
  const text = await res.text();
  let data = {};
  try { data = text ? JSON.parse(text) : {}; } catch (e) { data = { message: text }; }
  if (!res.ok) {
    const err = new APIError(data.code || String(res.status), data.message || res.statusText);
    if (err.code === "unauthenticated") { signOut(explain(err)); }
    throw err;
  }
  return data;
}

// watch calls a server-streaming method with the Connect protocol's
// enveloped JSON and hands each message to onMessage until the stream ends.
async function watch(method, body, onMessage, signal) {
  const json = new TextEncoder().encode(JSON.stringify(body));
  const frame = new Uint8Array(5 + json.length);
  new DataView(frame.buffer).setUint32(1, json.length);
  frame.set(json, 5);
  const res = await fetch(service + method, {
    method: "POST", signal, body: frame,
    headers: { "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", "Authorization": "Bearer " + token() },
  });
  if (!res.ok) {
    const data = await res.json().catch(() => ({}));
    throw new APIError(data.code || String(res.status), data.message || res.statusText);
  }
  const reader = res.body.getReader();
  let buf = new Uint8Array(0);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const joined = new Uint8Array(buf.length + value.length);
    joined.set(buf); joined.set(value, buf.length); buf = joined;
    while (buf.length >= 5) {
      const size = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
      if (buf.length < 5 + size) break;
      const flags = buf[0];
      const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + size)));
      buf = buf.slice(5 + size);
      if (flags & 2) {
        if (msg.error) throw new APIError(msg.error.code, msg.error.message);
        return;
      }
      onMessage(msg);
    }
  }
}

// explain turns an API error into words for the page.
function explain(err) {
  switch (err.code) {
    case "unauthenticated": return "Sign-in failed: " + err.message;
    case "permission_denied": return "Not allowed: " + err.message;
    case "failed_precondition": return "Refused: " + err.message;
    default: return err.message || String(err);
  }
}

// el builds an element: el("td", {class: "x"}, "text", child...).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === undefined || v === null) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes);
}

function notice(text, kind) {
  const n = document.getElementById("notice");
  n.replaceChildren(text ? el("p", { class: kind || "info" }, text) : "");
}

function when(ts) { return ts ? new Date(ts).toLocaleString() : "—"; }

function badge(phase) {
  const kind = { Ready: "ok", AwaitingApproval: "warn", Planning: "warn", Applying: "warn", Failed: "bad", Deleting: "bad" }[phase] || "idle";
  const words = { AwaitingApproval: "Awaiting approval" }[phase] || phase || "Unknown";
  return el("span", { class: "badge " + kind, "data-phase": phase || "" }, words);
}

function lastRun(inst) {
  let latest = "";
  for (const c of inst.conditions || []) {
    if (c.lastTransitionTime && c.lastTransitionTime > latest) latest = c.lastTransitionTime;
  }
  return latest;
}

function stopView() { cleanup.forEach((f) => f()); cleanup = []; }

function signOut(message) {
  stopView();
  sessionStorage.clear();
  localStorage.removeItem(tokenKey);
  document.getElementById("nav").hidden = true;
  if (location.hash !== "#/") history.replaceState(null, "", "#/");
  renderSignIn(message);
}

function renderSignIn(message) {
  document.getElementById("nav").hidden = true;
  notice("");
  const area = el("textarea", { id: "token", name: "token", required: true, autocomplete: "off", spellcheck: "false", "aria-describedby": "token-hint" });
  const error = el("div", { id: "sign-in-error", role: "alert" }, message ? el("p", { class: "error" }, message) : "");
  const form = el("form", { class: "card", id: "sign-in" },
    el("h1", {}, "Sign in"),
    el("label", { for: "token" }, "Kubernetes bearer token"),
    el("p", { class: "hint", id: "token-hint" }, "A token of the cluster, e.g. from ", el("code", {}, "kubectl create token <serviceaccount> -n " + serverNamespace),
      ". It is kept in this tab only and sent with each request; the cluster's RBAC decides what you may do."),
    area, error,
    el("div", { class: "actions" }, el("button", { type: "submit", class: "primary" }, "Sign in"),
      oidcEnabled ? el("a", { class: "button", href: "/oidc/login", id: "oidc-sign-in" }, "Sign in with your identity provider") : ""));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    sessionStorage.setItem(tokenKey, area.value.trim());
    try {
      await call("ListAll", {});
      area.value = "";
      route();
    } catch (err) {
      sessionStorage.removeItem(tokenKey);
      error.replaceChildren(el("p", { class: "error" }, err.code === "unauthenticated" ? "Sign-in failed: " + err.message : explain(err)));
      area.focus();
    }
  });
  show(form);
  area.focus();
}

// Stacks: every installation the caller may list, filtered, kept up to
// date by WatchAll (listed again whenever a stream ends).
function renderList() {
  const ns = el("select", { id: "filter-namespace" }, el("option", { value: "" }, "All namespaces"));
  const phase = el("select", { id: "filter-status" }, el("option", { value: "" }, "Any status"), phases.map((p) => el("option", { value: p }, p)));
  const label = el("input", { id: "filter-label", type: "search", placeholder: "team=web" });
  const body = el("tbody");
  const note = el("div");
  const table = el("div", { class: "table-wrap" }, el("table", { id: "stacks" },
    el("caption", { class: "hint" }, "Installations, updated live"),
    el("thead", {}, el("tr", {}, ["Name", "Namespace", "Status", "Message", "Revision", "Pending plan", "Last change"].map((h, i) =>
      el("th", { scope: "col", class: i === 1 || i === 4 || i === 6 ? "wide" : "" }, h)))), body));
  const filters = el("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); restart(); } },
    el("div", {}, el("label", { for: "filter-namespace" }, "Namespace"), ns),
    el("div", {}, el("label", { for: "filter-status" }, "Status"), phase),
    el("div", {}, el("label", { for: "filter-label" }, "Label selector"), label),
    el("button", { type: "submit" }, "Filter"));
  ns.addEventListener("change", restart);
  phase.addEventListener("change", restart);
  show(el("h1", {}, "Stacks"), filters, note, table);
  const items = new Map();
  let abort = null;
  cleanup.push(() => abort && abort.abort());

  function draw() {
    const known = new Set([...ns.options].map((o) => o.value));
    const rows = [...items.values()].sort((a, b) => (a.namespace + "/" + a.name).localeCompare(b.namespace + "/" + b.name)).map((i) => {
      if (!known.has(i.namespace)) { ns.append(el("option", { value: i.namespace }, i.namespace)); known.add(i.namespace); }
      const here = i.namespace === serverNamespace;
      return el("tr", { "data-name": i.name, "data-namespace": i.namespace },
        el("td", {}, here ? el("a", { href: "#/stack/" + encodeURIComponent(i.name) }, i.name) : i.name),
        el("td", { class: "wide" }, i.namespace), el("td", {}, badge(i.phase)), el("td", { class: "message" }, i.message || ""),
        el("td", { class: "wide" }, el("code", {}, (i.revision || "").slice(0, 19))),
        el("td", {}, i.pendingPlan ? el("code", {}, i.pendingPlan) : "—"), el("td", { class: "wide" }, when(lastRun(i))));
    });
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 7 }, "No installations match."))]));
  }

  function restart() {
    if (abort) abort.abort();
    abort = new AbortController();
    follow(abort.signal);
  }

  async function follow(signal) {
    const req = { namespace: ns.value, phase: phase.value, labelSelector: label.value.trim() };
    while (!signal.aborted) {
      try {
        const out = await call("ListAll", req, signal);
        note.replaceChildren(out.namespacesNote ? el("p", { class: "info" }, out.namespacesNote) : "");
        items.clear();
        for (const i of out.items || []) items.set(i.namespace + "/" + i.name, i);
        draw();
        await watch("WatchAll", req, (m) => {
          const key = m.installation.namespace + "/" + m.installation.name;
          if (m.deleted) items.delete(key); else items.set(key, m.installation);
          draw();
        }, signal);
      } catch (err) {
        if (signal.aborted) return;
        note.replaceChildren(el("p", { class: "error" }, explain(err)));
        if (err.code === "invalid_argument" || err.code === "permission_denied" || err.code === "unauthenticated") return;
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
  restart();
}

// A Stack: follows the installation with Watch and reloads its plan,
// releases and outputs when they change.
function renderStack(name) {
  const abort = new AbortController();
  cleanup.push(() => abort.abort());
  const signal = abort.signal;
  const title = el("h1", {}, name);
  const summary = el("section", { "aria-labelledby": "h-summary" });
  const actions = el("div", { class: "actions" });
  const plan = el("section", { id: "plan", "aria-labelledby": "h-plan" });
  const conditions = el("section", { "aria-labelledby": "h-conditions" });
  const releases = el("section", { id: "releases", "aria-labelledby": "h-releases" });
  const outputs = el("section", { id: "outputs", "aria-labelledby": "h-outputs" });
  const log = el("section", { id: "log", "aria-labelledby": "h-log" });
  const message = el("div", { id: "action-result", role: "alert" });
  show(el("p", {}, el("a", { href: "#/" }, "← Stacks")), title, summary, actions, message, plan, conditions, releases, outputs, log);
  let access = {};
  let seen = { plan: null, release: null, run: null };
  const req = { name };

  async function act(method, body, what) {
    message.replaceChildren();
    try {
      await call(method, body, signal);
      notice(what);
    } catch (err) {
      message.replaceChildren(el("p", { class: "error" }, explain(err)));
    }
  }

  function drawActions(inst) {
    const why = access.update ? null : "You may not update Stacks in namespace " + inst.namespace + ".";
    actions.replaceChildren(
      el("button", { type: "button", id: "reconcile", disabled: !access.update, title: why, onclick: () => act("Reconcile", req, "Reconcile requested.") }, "Reconcile"),
      inst.suspended
        ? el("button", { type: "button", id: "resume", disabled: !access.update, title: why, onclick: () => act("Resume", req, "Resumed.") }, "Resume")
        : el("button", { type: "button", id: "suspend", disabled: !access.update, title: why, onclick: () => act("Suspend", req, "Suspended: no run starts until you resume.") }, "Suspend"),
      why ? el("span", { class: "hint" }, why) : "");
  }

  function drawSummary(inst) {
    const src = inst.source || {};
    summary.replaceChildren(el("h2", { id: "h-summary" }, "Summary"), el("dl", { class: "facts" },
      el("dt", {}, "Status"), el("dd", { id: "phase" }, badge(inst.phase)),
      el("dt", {}, "Message"), el("dd", { id: "ready-message" }, inst.message || "—"),
      el("dt", {}, "Namespace"), el("dd", {}, inst.namespace),
      el("dt", {}, "Source"), el("dd", {}, src.programRef ? "Program " + src.programRef : src.url || src.sourceRef || "—"),
      el("dt", {}, "Revision"), el("dd", {}, el("code", {}, inst.revision || "—")),
      el("dt", {}, "Release"), el("dd", { id: "release" }, inst.release ? String(inst.release) : "none yet"),
      el("dt", {}, "Approval"), el("dd", {}, inst.approvePlan === "auto" ? "every plan is applied" : "plans wait for approval")));
    conditions.replaceChildren(el("h2", { id: "h-conditions" }, "Conditions"), el("div", { class: "table-wrap" }, el("table", {},
      el("thead", {}, el("tr", {}, ["Type", "Status", "Reason", "Message", "Since"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, (inst.conditions || []).map((c) => el("tr", {}, el("td", {}, c.type), el("td", {}, c.status), el("td", {}, c.reason || ""),
        el("td", { class: "message" }, c.message || ""), el("td", {}, when(c.lastTransitionTime))))))));
  }

  async function drawPlan(inst) {
    if (!inst.pendingPlan) {
      plan.replaceChildren(el("h2", { id: "h-plan" }, "Plan"), el("p", {}, "No plan is waiting for approval."));
      return;
    }
    let p;
    try { p = await call("GetPlan", req, signal); } catch (err) {
      plan.replaceChildren(el("h2", { id: "h-plan" }, "Plan"), el("p", { class: "error" }, explain(err)));
      return;
    }
    const why = !access.update ? "You may not update this Stack, so you cannot approve its plan." : !p.approvable ? "This plan is not waiting for approval." : "";
    const approve = el("button", { type: "button", class: "primary", id: "approve", "data-plan": p.id, disabled: !!why, "aria-describedby": why ? "approve-why" : null,
      onclick: async () => {
        approve.disabled = true;
        await act("ApprovePlan", { name, planId: p.id }, "Plan " + p.id + " approved: it is being applied.");
      } }, "Approve plan " + p.id);
    plan.replaceChildren(el("h2", { id: "h-plan" }, "Plan ", el("code", {}, p.id)),
      el("div", { class: "counts", "aria-label": "Plan summary" },
        el("div", {}, el("span", { class: "add" }, String(p.add || 0)), " to add"),
        el("div", {}, el("span", { class: "change" }, String(p.change || 0)), " to change"),
        el("div", {}, el("span", { class: "destroy" }, String(p.destroy || 0)), " to destroy"),
        p.drift ? el("div", {}, el("span", { class: "drift" }, String(p.drift)), " drifted") : "",
        p.destroyPlan ? el("strong", { class: "destroy" }, "This plan destroys everything.") : ""),
      el("p", { class: "hint" }, "Planned " + when(p.createdAt) + (p.revision ? " from " + p.revision : "") + ". Sensitive values are masked."),
      p.readable ? el("pre", { id: "plan-text", tabindex: "0", "aria-label": "The plan" }, p.readable) : el("p", { class: "info" }, p.note || "No readable plan is stored."),
      el("div", { class: "actions" }, approve, why ? el("span", { class: "hint", id: "approve-why" }, why) : ""));
  }

  async function drawReleases() {
    try {
      const out = await call("ListReleases", req, signal);
      const items = (out.items || []).slice().reverse();
      releases.replaceChildren(el("h2", { id: "h-releases" }, "Releases"), el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, ["Revision", "Status", "Added", "Changed", "Destroyed", "Finished", "Source"].map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, items.length ? items.map((r) => el("tr", { "data-revision": r.revision },
          el("td", {}, String(r.revision)), el("td", {}, r.status), el("td", {}, String(r.plan?.add || 0)), el("td", {}, String(r.plan?.change || 0)),
          el("td", {}, String(r.plan?.destroy || 0)), el("td", {}, when(r.finishedAt)), el("td", {}, el("code", { title: r.sourceRevision || "" }, (r.sourceRevision || "").slice(0, 19)))))
          : el("tr", {}, el("td", { colspan: 7 }, "No release yet."))))));
    } catch (err) {
      releases.replaceChildren(el("h2", { id: "h-releases" }, "Releases"), el("p", { class: "info" }, explain(err)));
    }
  }

  async function drawOutputs() {
    try {
      const out = await call("GetOutputs", req, signal);
      outputs.replaceChildren(el("h2", { id: "h-outputs" }, "Outputs"), out.note ? el("p", { class: "hint" }, out.note) : "",
        el("dl", { class: "facts" }, (out.items || []).map((o) => [el("dt", {}, o.name),
          el("dd", {}, o.masked || o.value === undefined ? el("span", { class: "masked" }, "(sensitive, hidden)") : el("code", {}, o.value))])));
    } catch (err) {
      outputs.replaceChildren(el("h2", { id: "h-outputs" }, "Outputs"), el("p", { class: "info" }, explain(err)));
    }
  }

  async function drawLog() {
    if (!access.readLogs) {
      log.replaceChildren(el("h2", { id: "h-log" }, "Run log"), el("p", { class: "info" }, "You may not read pod logs in this namespace."));
      return;
    }
    try {
      const out = await call("GetRunLog", { name, tailLines: 400 }, signal);
      log.replaceChildren(el("h2", { id: "h-log" }, "Run log", out.run ? " — run " + out.run + (out.active ? " (running)" : "") : ""),
        out.text ? el("pre", { id: "log-text", tabindex: "0", "aria-label": "Run log" }, out.text) : el("p", { class: "hint" }, out.note || "The log is empty."));
    } catch (err) {
      log.replaceChildren(el("h2", { id: "h-log" }, "Run log"), el("p", { class: "info" }, explain(err)));
    }
  }

  function update(inst) {
    drawSummary(inst);
    drawActions(inst);
    if (seen.plan !== (inst.pendingPlan || "")) { seen.plan = inst.pendingPlan || ""; drawPlan(inst); }
    if (seen.release !== (inst.release || 0)) { seen.release = inst.release || 0; drawReleases(); drawOutputs(); }
  }

  async function follow() {
    while (!signal.aborted) {
      try {
        await watch("Watch", req, (m) => { update(m.installation); if (m.deleted) notice("This installation was deleted."); }, signal);
      } catch (err) {
        if (signal.aborted) return;
        message.replaceChildren(el("p", { class: "error" }, explain(err)));
        if (err.code === "not_found" || err.code === "permission_denied" || err.code === "unauthenticated") return;
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  }

  (async () => {
    try { access = await call("GetAccess", req, signal); } catch (err) { access = {}; }
    follow();
    drawLog();
    const timer = setInterval(drawLog, 3000);
    cleanup.push(() => clearInterval(timer));
  })();
}

// Install: a form for an installation from a Program (fields from its
// declared variables) or a tarball URL.
function renderInstall() {
  const field = (id, labelText, input, hint) => el("div", {}, el("label", { for: id }, labelText), hint ? el("p", { class: "hint", id: id + "-hint" }, hint) : "", input);
  const name = el("input", { id: "i-name", required: true, pattern: "[a-z0-9]([a-z0-9.-]*[a-z0-9])?", autocomplete: "off" });
  const kind = el("select", { id: "i-kind" }, el("option", { value: "program" }, "A Program of namespace " + serverNamespace), el("option", { value: "url" }, "A tar.gz at a URL"));
  const program = el("input", { id: "i-program", autocomplete: "off", "aria-describedby": "i-program-hint" });
  const url = el("input", { id: "i-url", type: "url", autocomplete: "off" });
  const digest = el("input", { id: "i-digest", autocomplete: "off", placeholder: "sha256:…" });
  const cluster = el("input", { id: "i-cluster", autocomplete: "off", "aria-describedby": "i-cluster-hint" });
  const auto = el("input", { id: "i-auto", type: "checkbox" });
  const vars = el("fieldset", { id: "i-vars" }, el("legend", {}, "Values"));
  const result = el("div", { role: "alert" });
  const programPart = el("div", {}, field("i-program", "Program", program, "Its variables become the fields below."),
    el("button", { type: "button", id: "i-load", onclick: loadVariables }, "Load variables"));
  const urlPart = el("div", { hidden: true }, field("i-url", "Tarball URL", url), field("i-digest", "Digest", digest));
  let declared = [];
  kind.addEventListener("change", () => { programPart.hidden = kind.value !== "program"; urlPart.hidden = kind.value !== "url"; });
  async function loadVariables() {
    result.replaceChildren();
    try {
      const out = await call("GetProgramVariables", { program: program.value.trim(), cluster: cluster.value.trim() });
      declared = out.items || [];
      vars.replaceChildren(el("legend", {}, "Values"), ...(declared.length ? declared.map((v) => field("v-" + v.name, v.name + (v.required ? " (required)" : ""),
        el("input", { id: "v-" + v.name, "data-var": v.name, "data-type": v.type || "", type: v.sensitive ? "password" : "text", autocomplete: "off",
          placeholder: v.default !== undefined && !v.sensitive ? v.default : "" }),
        [v.description, v.type ? "type " + v.type : "", v.type && v.type !== "string" ? "(JSON)" : ""].filter(Boolean).join(" · "))) : [el("p", {}, "The Program declares no variables.")]));
    } catch (err) {
      result.replaceChildren(el("p", { class: "error" }, explain(err)));
    }
  }
  const form = el("form", { class: "card", id: "install" }, el("h1", {}, "Install"),
    field("i-name", "Name", name), field("i-kind", "Source", kind), programPart, urlPart,
    field("i-cluster", "Target cluster", cluster, "Empty: the cluster this server runs in; else a cluster registered in the TerraceConfig (spec.api.clusters)."),
    el("div", {}, el("label", { for: "i-auto" }, auto, " Apply every plan without approval")), vars, result,
    el("div", { class: "actions" }, el("button", { type: "submit", class: "primary" }, "Install")));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const values = {};
    for (const input of vars.querySelectorAll("input[data-var]")) {
      if (input.value === "") continue;
      const type = input.dataset.type;
      try { values[input.dataset.var] = type && type !== "string" ? JSON.parse(input.value) : input.value; } catch (err) {
        result.replaceChildren(el("p", { class: "error" }, input.dataset.var + " must be JSON (" + type + "): " + err.message));
        input.focus();
        return;
      }
    }
    const source = kind.value === "program" ? { programRef: program.value.trim() } : { url: url.value.trim(), digest: digest.value.trim() };
    try {
      const inst = await call("Create", { name: name.value.trim(), cluster: cluster.value.trim(), source, values, approvePlan: auto.checked ? "auto" : "" });
      location.hash = "#/stack/" + encodeURIComponent(inst.name);
    } catch (err) {
      result.replaceChildren(el("p", { class: "error" }, explain(err)));
    }
  });
  show(form);
}

function route() {
  stopView();
  notice("");
  if (!token()) { renderSignIn(); return; }
  document.getElementById("nav").hidden = false;
  document.getElementById("who").textContent = "Namespace " + serverNamespace;
  const path = location.hash.replace(/^#/, "").split("?")[0];
  const stack = path.match(/^\/stack\/([^/]+)$/);
  if (stack) renderStack(decodeURIComponent(stack[1]));
  else if (path === "/install") renderInstall();
  else renderList();
  document.getElementById("main").focus({ preventScroll: true });
}

// An OIDC sign-in hands the ID token (or its error) over in the fragment.
function takeFragment() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  if (params.has("id_token")) {
    sessionStorage.setItem(tokenKey, params.get("id_token"));
    history.replaceState(null, "", "#/");
  } else if (params.has("sign_in_error")) {
    const message = params.get("sign_in_error");
    history.replaceState(null, "", "#/");
    return message;
  }
  return null;
}

document.getElementById("sign-out").addEventListener("click", () => signOut("Signed out: the token was removed from this tab."));
window.addEventListener("hashchange", route);
const failed = takeFragment();
if (failed) renderSignIn("Sign-in failed: " + failed); else route();
