// A Stack page (any Stack of a namespace the caller may read): follows
// the Stack with Watch and reloads its plan, releases and outputs when
// they change; every call names the Stack's namespace, so the caller's
// RBAC there decides.
"use strict";

function renderStack(namespace, name) {
  const abort = new AbortController();
  cleanup.push(() => abort.abort());
  const signal = abort.signal;
  const title = el("h1", {}, el("span", { class: "hint" }, namespace + " / "), name);
  const summary = el("section", { "aria-labelledby": "h-summary" });
  const actions = el("div", { class: "actions" });
  const plan = el("section", { id: "plan", "aria-labelledby": "h-plan" });
  const conditions = el("section", { "aria-labelledby": "h-conditions" });
  const releases = el("section", { id: "releases", "aria-labelledby": "h-releases" });
  const pulls = el("section", { id: "pull-requests", "aria-labelledby": "h-pull-requests" });
  const outputs = el("section", { id: "outputs", "aria-labelledby": "h-outputs" });
  const log = el("section", { id: "log", "aria-labelledby": "h-log" });
  const message = el("div", { id: "action-result", role: "alert" });
  show(el("p", {}, el("a", { href: "#/" }, "← Stacks")), title, summary, actions, message, plan, pulls, conditions, releases, outputs, log);
  let access = {};
  let seen = { plan: null, release: null, run: null };
  const req = { namespace, name };

  async function act(method, body, what) {
    message.replaceChildren();
    try {
      await call(method, body, signal);
      notice(what);
    } catch (err) {
      message.replaceChildren(el("p", { class: "error" }, explain(err)));
    }
  }

  let drawnActions = "";
  function drawActions(inst) {
    const why = access.update ? null : "You may not update Stacks in namespace " + inst.namespace + ".";
    // Made again only when they change: a button replaced under the pointer
    // or the keyboard's focus would lose the click or the focus.
    const key = JSON.stringify([!!inst.suspended, why]);
    if (key === drawnActions) return;
    drawnActions = key;
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
      el("dt", {}, "Source"), el("dd", {}, src.programRef ? "Program " + src.programRef : src.url || src.sourceRef || src.gitUrl || "—"),
      el("dt", {}, "Revision"), el("dd", {}, el("code", {}, inst.revision || "—")),
      inst.git ? el("dt", {}, "Commit") : "", inst.git ? el("dd", { id: "git-commit" }, el("code", {}, inst.git.revision || ""),
        inst.git.message ? " " + inst.git.message : "", inst.git.author ? el("span", { class: "hint" }, " by " + inst.git.author + (inst.git.committedAt ? ", " + when(inst.git.committedAt) : "")) : "") : "",
      el("dt", {}, "Release"), el("dd", { id: "release" }, inst.release ? String(inst.release) : "none yet"),
      el("dt", {}, "Approval"), el("dd", {}, inst.approvePlan === "auto" ? "every plan is applied" : inst.approvePlan ? "plan " + inst.approvePlan + " approved" : "plans wait for approval"),
      el("dt", {}, "Made by"), el("dd", { id: "made-by" }, inst.installation ? "the Installations API (an installation)" : "kubectl or another tool (not an installation)"),
      el("dt", {}, "Suspended"), el("dd", { id: "suspended" }, inst.suspended ? "yes: no run starts until it is resumed" : "no")));
    conditions.replaceChildren(el("h2", { id: "h-conditions" }, "Conditions"), el("div", { class: "table-wrap" }, el("table", {},
      el("thead", {}, el("tr", {}, ["Type", "Status", "Reason", "Message", "Since"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, (inst.conditions || []).map((c) => el("tr", {}, el("td", {}, c.type), el("td", {}, c.status), el("td", {}, c.reason || ""),
        el("td", { class: "message" }, c.message || ""), el("td", {}, when(c.lastTransitionTime))))))));
  }

  // Only http(s) links to the forge: a URL in status is the forge's answer.
  function forgeLink(url, text) {
    return /^https?:\/\//.test(url || "") ? el("a", { href: url, rel: "noreferrer noopener", target: "_blank" }, text) : text;
  }

  function drawPullRequests(inst) {
    const prs = inst.pullRequests || [];
    if (!prs.length) {
      pulls.replaceChildren();
      return;
    }
    pulls.replaceChildren(el("h2", { id: "h-pull-requests" }, "Pull request plans"), el("div", { class: "table-wrap" }, el("table", {},
      el("thead", {}, el("tr", {}, ["Pull request", "Head", "Status", "Added", "Changed", "Destroyed", "Planned", "Message"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, prs.map((p) => el("tr", {},
        el("td", {}, forgeLink(p.url, "#" + p.number + (p.title ? " " + p.title : ""))),
        el("td", {}, el("code", { title: p.headRevision || "" }, (p.headRevision || "").replace(/@sha1:([0-9a-f]{8})[0-9a-f]*/, "@$1"))),
        el("td", {}, badge(p.status || "Pending")), el("td", {}, String(p.add || 0)), el("td", {}, String(p.change || 0)), el("td", {}, String(p.destroy || 0)),
        el("td", {}, when(p.plannedAt)), el("td", { class: "message" }, p.message || "")))))),
      el("p", { class: "hint" }, "Plans of pull requests only read the state: they never apply. terrace describe " + name + " -n " + namespace + " lists them too."));
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
        await act("ApprovePlan", { namespace, name, planId: p.id }, "Plan " + p.id + " approved: it is being applied.");
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
      const out = await call("GetRunLog", { namespace, name, tailLines: 400 }, signal);
      log.replaceChildren(el("h2", { id: "h-log" }, "Run log", out.run ? " — run " + out.run + (out.active ? " (running)" : "") : ""),
        out.text ? el("pre", { id: "log-text", tabindex: "0", "aria-label": "Run log" }, out.text) : el("p", { class: "hint" }, out.note || "The log is empty."));
    } catch (err) {
      log.replaceChildren(el("h2", { id: "h-log" }, "Run log"), el("p", { class: "info" }, explain(err)));
    }
  }

  function update(inst) {
    drawSummary(inst);
    drawPullRequests(inst);
    drawActions(inst);
    if (seen.plan !== (inst.pendingPlan || "")) { seen.plan = inst.pendingPlan || ""; drawPlan(inst); }
    if (seen.release !== (inst.release || 0)) { seen.release = inst.release || 0; drawReleases(); drawOutputs(); }
  }

  async function follow() {
    while (!signal.aborted) {
      try {
        await watch("Watch", req, (m) => { update(m.installation); if (m.deleted) notice("This Stack was deleted."); }, signal);
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

