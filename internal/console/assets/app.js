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

const lookInKey = "terrace.namespaces";
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
  const kind = { Ready: "ok", AwaitingApproval: "warn", Planning: "warn", Applying: "warn", Failed: "bad", Deleting: "bad", Planned: "ok", Pending: "warn" }[phase] || "idle";
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

// stackHref is the page of a Stack: #/stack/<namespace>/<name>.
function stackHref(i) { return "#/stack/" + encodeURIComponent(i.namespace) + "/" + encodeURIComponent(i.name); }

// Stacks: every Stack the caller may list, filtered, kept up to
// date by WatchAll (listed again whenever a stream ends).
function renderList() {
  const ns = el("select", { id: "filter-namespace" }, el("option", { value: "" }, "All namespaces"));
  const phase = el("select", { id: "filter-status" }, el("option", { value: "" }, "Any status"), phases.map((p) => el("option", { value: p }, p)));
  const label = el("input", { id: "filter-label", type: "search", placeholder: "team=web" });
  // More namespaces to look in when the caller may list neither Stacks
  // everywhere nor Namespaces; kept with the token, cleared at sign-out.
  const lookIn = el("input", { id: "filter-look-in", type: "search", placeholder: "team-a, team-b", value: sessionStorage.getItem(lookInKey) || "" });
  const body = el("tbody");
  const note = el("div");
  const table = el("div", { class: "table-wrap" }, el("table", { id: "stacks" },
    el("caption", { class: "hint" }, "Stacks, updated live"),
    el("thead", {}, el("tr", {}, ["Name", "Namespace", "Status", "Message", "Revision", "Pending plan", "Last change"].map((h, i) =>
      el("th", { scope: "col", class: i === 1 || i === 4 || i === 6 ? "wide" : "" }, h)))), body));
  const filters = el("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); restart(); } },
    el("div", {}, el("label", { for: "filter-namespace" }, "Namespace"), ns),
    el("div", {}, el("label", { for: "filter-status" }, "Status"), phase),
    el("div", {}, el("label", { for: "filter-label" }, "Label selector"), label),
    el("div", {}, el("label", { for: "filter-look-in" }, "Also look in"), lookIn),
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
      return el("tr", { "data-name": i.name, "data-namespace": i.namespace, "data-installation": i.installation ? "true" : "false" },
        el("td", {}, el("a", { href: stackHref(i) }, i.name), i.installation ? el("span", { class: "tag", title: "Made through the Installations API" }, "installation") : ""),
        el("td", { class: "wide" }, i.namespace), el("td", {}, badge(i.phase)), el("td", { class: "message" }, i.message || ""),
        el("td", { class: "wide" }, el("code", {}, (i.revision || "").slice(0, 19))),
        el("td", {}, i.pendingPlan ? el("code", {}, i.pendingPlan) : "—"), el("td", { class: "wide" }, when(lastRun(i))));
    });
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 7 }, "No Stacks match."))]));
  }

  function restart() {
    if (abort) abort.abort();
    abort = new AbortController();
    follow(abort.signal);
  }

  async function follow(signal) {
    sessionStorage.setItem(lookInKey, lookIn.value.trim());
    const namespaces = lookIn.value.split(/[\s,]+/).filter((n) => n);
    const req = { namespace: ns.value, phase: phase.value, labelSelector: label.value.trim(), namespaces };
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

// Install: a form for an installation from a Program (fields from its
// declared variables) or a tarball URL.
function renderInstall() {
  const field = (id, labelText, input, hint) => el("div", {}, el("label", { for: id }, labelText), hint ? el("p", { class: "hint", id: id + "-hint" }, hint) : "", input);
  const name = el("input", { id: "i-name", required: true, pattern: "[a-z0-9]([a-z0-9.-]*[a-z0-9])?", autocomplete: "off" });
  const namespace = el("input", { id: "i-namespace", autocomplete: "off", value: serverNamespace, "aria-describedby": "i-namespace-hint" });
  const kind = el("select", { id: "i-kind" }, el("option", { value: "program" }, "A Program of that namespace"), el("option", { value: "url" }, "A tar.gz at a URL"));
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
      const out = await call("GetProgramVariables", { namespace: namespace.value.trim(), program: program.value.trim(), cluster: cluster.value.trim() });
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
    field("i-name", "Name", name), field("i-namespace", "Namespace", namespace, "Where the Stack and its values Secret are made; your rights there decide."),
    field("i-kind", "Source", kind), programPart, urlPart,
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
      const inst = await call("Create", { name: name.value.trim(), namespace: namespace.value.trim(), cluster: cluster.value.trim(), source, values, approvePlan: auto.checked ? "auto" : "" });
      location.hash = stackHref(inst);
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
  // #/stack/<name> (the server's namespace) is kept for links made before namespaces.
  const stack = path.match(/^\/stack\/(?:([^/]+)\/)?([^/]+)$/);
  if (stack) renderStack(stack[1] ? decodeURIComponent(stack[1]) : serverNamespace, decodeURIComponent(stack[2]));
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
