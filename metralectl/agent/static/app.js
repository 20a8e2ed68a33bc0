// The control-plane page: polls the local agent's API and renders it. No framework, no CDN.
// The API token arrives in the URL fragment (#token=..., never sent to a server), is kept in
// sessionStorage for this tab, and is sent as a bearer token on POSTs only.
// Every text it shows goes through clean() (safetext.js, loaded first): el() for built nodes, setText()
// for the rest; nothing is written as HTML.
"use strict";

const $ = (sel) => document.querySelector(sel);
const TEXT_LIMIT = 2000;  // characters of one shown text (a line, a cell)
function setText(node, text) { node.textContent = clean(text, TEXT_LIMIT); }
let token = sessionStorage.getItem("metralectl-token") || "";
let serving = [];
let currentJob = null;

function takeTokenFromFragment() {
  const m = /(?:^|[#&])token=([A-Za-z0-9_-]+)/.exec(location.hash);
  if (m) {
    token = m[1];
    sessionStorage.setItem("metralectl-token", token);
    history.replaceState(null, "", location.pathname + location.search);
  }
}

// Without the token the page is read-only: its action buttons are disabled and say why.
const NEEDS_TOKEN = "needs the agent's token: run `metralectl agent url` and open that address (or paste the token below)";
function actionAttrs(onclick, busy = false) {
  return { onclick, disabled: busy || !token, title: token ? false : NEEDS_TOKEN };
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? "" : clean(v, TEXT_LIMIT));
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(clean(c, TEXT_LIMIT)));
  return node;
}

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok && !body.error) body.error = `HTTP ${r.status}`;
  return body;
}

async function post(path, body) {
  if (!token) { renderToken(); return null; }
  const r = await fetch(path, {
    method: "POST", cache: "no-store", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "Authorization": `Bearer ${token}` },
    body: JSON.stringify(body),
  });
  const answer = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (r.status === 401) { token = ""; sessionStorage.removeItem("metralectl-token"); }
  if (!r.ok) {
    showActionError(`${path.replace("/api/", "")} refused: ${answer.error || r.status}${answer.hint ? " — hint: " + answer.hint : ""}`);
    renderToken();
    return null;
  }
  showActionError("");
  return answer;
}

// A refusal (busy: the lock is held; a bad request) is shown on the page, not in an alert() that a
// browser may suppress.
function showActionError(text) {
  $("#action-error").hidden = !text;
  setText($("#action-error-text"), text);
}

function ago(unix) {
  if (!unix) return "";
  const s = Math.max(0, Math.round(Date.now() / 1000 - unix));
  return s < 60 ? `${s} s ago` : `${Math.round(s / 60)} min ago`;
}

// -- capability ---------------------------------------------------------------------------------
async function refreshCapability() {
  const cap = await getJSON("/api/status").catch((e) => ({ can_run: false, summary: `the agent does not answer (${e})`, problems: [] }));
  const card = $("#capability");
  card.classList.remove("ready", "limited", "cannot", "checking");
  const list = $("#cap-problems");
  list.replaceChildren();
  const listProblems = (items) => {
    for (const p of items || []) {
      list.append(el("li", {}, el("strong", {}, p.title || p.id), ": ", p.detail || "",
        p.remedy ? el("span", { class: "remedy" }, p.remedy) : ""));
    }
  };
  if (cap.can_run === true && cap.scope === "cpu") {
    // no usable GPU, but the recipes of a CPU class run here: what stands between it and the GPU ones
    card.classList.add("ready", "limited");
    setText($("#cap-title"), "Ready for CPU recipes only (no usable GPU)");
    listProblems(cap.limits);
  } else if (cap.can_run === true) {
    card.classList.add("ready");
    setText($("#cap-title"), "Ready: this machine can run models");
  } else if (cap.can_run === false) {
    card.classList.add("cannot");
    setText($("#cap-title"), "This machine cannot run models");
    listProblems(cap.problems);
  } else {
    card.classList.add("checking");
    setText($("#cap-title"), "Checking this machine…");
  }
  card.dataset.canRun = String(cap.can_run);
  setText($("#cap-summary"), cap.summary || cap.error || "");
  setText($("#cap-age"), cap.checked_at_unix ? `checked ${ago(cap.checked_at_unix)} by the agent (it re-checks by itself)` : "");
}

// -- serving ------------------------------------------------------------------------------------
async function refreshServing() {
  const s = await getJSON("/api/serving");
  const err = $("#serving-error");
  err.hidden = !s.error;
  setText(err, s.error ? `${s.error}${s.hint ? " — " + s.hint : ""}` : "");
  serving = s.serving || [];
  // A change in progress on this machine, whoever started it (a CLI command, the dashboard, a peer's unit; its
  // lifecycle lock's holder), said here: the job card shows only this page's own jobs (it says those already).
  const ours = currentJob && !FINISHED.includes(currentJob.state);
  $("#serving-busy").hidden = !s.in_progress || ours;
  setText($("#serving-busy"), s.in_progress ? `In progress on this machine: ${s.in_progress}` : "");
  renderServing();
  renderGateways(s.gateways || []);
  $("#serving-empty").hidden = serving.length > 0 || !!s.error;
  if (s.degraded) { err.hidden = false; setText(err, `DEGRADED: ${s.degraded}`); }
  renderRecipeButtons();
}

function renderServing() {
  $("#serving tbody").replaceChildren(...serving.map((x) => el("tr", {},
    el("td", { title: x.recipe }, x.recipe), el("td", { title: x.name }, x.name), el("td", { class: "short" }, x.state),
    el("td", { class: "short" }, x.health), el("td", { class: "short" }, x.uptime), el("td", { title: x.endpoint }, x.endpoint),
    el("td", { class: "action" }, el("button", { class: "danger", ...actionAttrs(() => askStop(x)) }, "Stop")))));
}

// A gateway's numbers come from its own /metrics (agent/ops.py); one whose process is gone shows none.
function renderGateways(gateways) {
  $("#gateways").hidden = gateways.length === 0;
  const num = (g, v) => (g.state === "serving" && v !== null && v !== undefined ? String(v) : "-");
  const names = (g, list) => (g.state === "serving" && list.length ? list.join(", ") : "-");
  const loads = (g) => {
    if (g.state !== "serving" || !g.loads) return "-";
    const extra = ["failed", "refused"].filter((k) => g.loads[k]).map((k) => `, ${g.loads[k]} ${k}`).join("");
    return `${g.loads.loaded || 0}${extra}`;
  };
  $("#gateways tbody").replaceChildren(...gateways.map((g) => el("tr", { class: "gateway", "data-state": g.state },
    el("td", { title: g.url }, g.url), el("td", { class: "short" }, String(g.pid)),
    el("td", { class: g.state === "serving" ? "short ok" : "short muted", title: g.error || "" }, g.state),
    el("td", {}, names(g, g.routed || [])), el("td", {}, names(g, g.loading || [])),
    el("td", { class: "short" }, num(g, g.queue_depth)), el("td", { class: "short" }, loads(g)),
    el("td", { class: "short" }, num(g, g.evictions)), el("td", { class: "short" }, num(g, g.requests)),
    el("td", { class: "short" }, num(g, g.errors)))));
}

// -- recipes ------------------------------------------------------------------------------------
let recipes = [];
async function refreshRecipes() {
  const r = await getJSON("/api/recipes");
  $("#recipes-error").hidden = !r.error;
  setText($("#recipes-error"), r.error || "");
  recipes = r.recipes || [];
  setText($("#recipes-target"), r.target ? `judged on ${r.target.hardware || "?"} (${r.target.how})` : "");
  renderRecipeButtons();
}

// A recipe that cannot run here whatever serves (x.blocked: the launch's own words, the dashboard's too) has
// its Run/Swap disabled, and the line under its row says why, before anything is asked; FITS no/? says its
// reason on that line too (x.fit_note: the words of `list`'s footnotes and the dashboard's line).
function renderRecipeButtons() {
  const busy = currentJob && !FINISHED.includes(currentJob.state);
  const body = $("#recipes tbody");
  body.replaceChildren(...recipes.flatMap((x) => {
    const isServed = serving.some((s) => s.recipe === x.name && s.state.startsWith("running"));
    const action = serving.length ? ["Swap to", "/api/swap"] : ["Run", "/api/run"];
    const blocked = x.blocked ? x.blocked.error + (x.blocked.hint ? ` — ${x.blocked.hint}` : "") : "";
    const id = `why-${x.name}`;
    let cell;
    if (isServed) cell = el("span", { class: "ok" }, "serving");
    else if (blocked) cell = el("button", { disabled: true, title: blocked, "aria-describedby": id }, action[0]);
    else {
      cell = el("button", actionAttrs(() => (serving.length ? askSwap(x.name) : act(action[1], { recipe: x.name })), busy),
        action[0]);
    }
    const row = el("tr", {},
      el("td", { title: x.name }, x.name), el("td", { title: x.model }, x.model), el("td", { class: "short" }, x.quant),
      el("td", { class: "short" }, x.hardware),
      el("td", { class: `short ${x.fits === false ? "bad" : x.fits ? "ok" : "muted"}`, title: x.fits_reason || "" },
        x.fits === null ? "?" : x.fits ? "yes" : "no"),
      el("td", { class: "short" }, x.weights), el("td", { class: "short" }, x.validated_tok_s ?? "-"),
      el("td", { class: "action" }, cell));
    if (!x.fit_note && !(blocked && !isServed)) return [row];
    const why = el("td", { colspan: "8", id },
      x.fit_note ? el("span", { class: "fit" }, `Fits ${x.fits === null ? "?" : "no"}: ${x.fit_note}`) : "",
      blocked && !isServed ? el("span", { class: "blocked" }, `${action[0]}: ${blocked}`) : "");
    row.classList.add("has-why");
    return [row, el("tr", { class: "why" }, why)];
  }));
}

// -- jobs ---------------------------------------------------------------------------------------
async function act(path, body) {
  const job = await post(path, body);
  if (job) { currentJob = job; followJob(); }
}

const FINISHED = ["done", "failed", "cancelled"];

// Followed until it ends; a failed poll (the agent restarting, a dropped connection) is retried, never
// the end of following.
async function followJob() {
  if (!currentJob) return;
  try {
    // By the status, not by an "error" key: a failed job's own answer carries its error.
    const r = await fetch(`/api/jobs/${encodeURIComponent(currentJob.id)}`, { cache: "no-store", credentials: "same-origin" });
    if (r.ok) currentJob = await r.json();
  } catch (e) {
    console.warn(`following job ${currentJob.id}: ${e}`);
  }
  showJob();
  if (!FINISHED.includes(currentJob.state)) setTimeout(followJob, 1000);
  else { refreshServing(); refreshRecipes(); }  // a run may have pulled an image or weights: what can run changed
}

function showJob() {
  $("#job-card").hidden = false;
  setText($("#job-title"), `${currentJob.kind} ${currentJob.target || ""}`);
  setText($("#job-state"), currentJob.state + (currentJob.error ? `: ${currentJob.error}` : "") +
    (currentJob.hint ? ` (hint: ${currentJob.hint})` : ""));
  $("#job-state").className = ["failed", "cancelled"].includes(currentJob.state) ? "error" : currentJob.state === "done" ? "ok" : "";
  renderJobLog(currentJob.events || []);
  renderRecipeButtons();
}

// One row per event (joblog.js): the step, a human label, the detail — each a text node (el() cleans it).
function renderJobLog(events) {
  const box = $("#job-events");
  const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;  // following the end: keep following
  box.replaceChildren(...jobLogRows(events).map((r) => el("li", { class: r.failed ? "error" : r.warn ? "warn" : "" },
    el("span", { class: "step" }, r.step), el("span", { class: "label" }, r.label), el("span", { class: "detail" }, r.detail))));
  if (stick) box.scrollTop = box.scrollHeight;
}

// -- confirmation -------------------------------------------------------------------------------
// Stop and Swap change what serves: they only ask here (an in-page dialog naming what stops and what
// starts); only its Confirm sends the request. Cancel, Escape or a click outside send nothing.
let pending = null;  // {path, body, describe: () => {title, stops, starts}, key}

function servingKey() { return serving.map((s) => `${s.recipe}\u0000${s.name}\u0000${s.state}`).sort().join("\n"); }

function askStop(x) {
  ask("stop", "/api/stop", { recipe: x.recipe }, "Confirm stop", () => {
    const now = serving.filter((s) => s.recipe === x.recipe);
    return {
      title: `Stop ${x.recipe}?`,
      stops: now.length ? now.map((s) => `${s.recipe} (container ${s.name}${s.endpoint ? ", " + s.endpoint : ""}): stopped and removed`)
        : [`nothing: ${x.recipe} no longer serves`],
      starts: ["nothing: no model will be served"],
      nothing: now.length === 0,  // no stop to send: Confirm is not offered
      nothingText: "Nothing to stop",
    };
  });
}

function askSwap(recipe) {
  ask("swap", "/api/swap", { recipe }, "Confirm swap", () => ({
    title: `Swap to ${recipe}?`,
    stops: serving.length ? serving.map((s) => `${s.recipe} (container ${s.name}), after its requests in flight finish`)
      : ["nothing serves now"],
    starts: [`${recipe}: it serves once it is ready (if it fails, what served is restored)`],
  }));
}

function ask(action, path, body, confirmText, describe) {
  pending = { path, body, describe, confirmText, key: servingKey() };
  const dialog = $("#confirm");
  dialog.dataset.action = action;
  $("#confirm-note").hidden = true;
  showPending();
  if (!dialog.open) dialog.showModal();
  $("#confirm-cancel").focus();  // the safe button has the focus: Enter does not confirm by accident
}

function showPending() {
  const d = pending.describe();
  setText($("#confirm-title"), d.title);
  $("#confirm-stops").replaceChildren(...d.stops.map((t) => el("li", {}, t)));
  $("#confirm-starts").replaceChildren(...d.starts.map((t) => el("li", {}, t)));
  const go = $("#confirm-go");
  go.disabled = !!d.nothing;
  setText(go, d.nothing ? d.nothingText : pending.confirmText);
}

function confirmPending() {
  if (!pending) return;
  if (servingKey() !== pending.key) {  // what serves changed since the dialog opened: show it, ask again
    pending.key = servingKey();
    showPending();
    $("#confirm-note").hidden = false;
    return;
  }
  if (pending.describe().nothing) return;  // it no longer serves: there is nothing to send
  const { path, body } = pending;
  pending = null;
  $("#confirm").close();
  act(path, body);
}

function setUpConfirm() {
  const dialog = $("#confirm");
  $("#confirm-go").addEventListener("click", confirmPending);
  $("#confirm-cancel").addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => { pending = null; });  // Cancel, Escape (the dialog's cancel), Confirm
  dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); });  // the backdrop
}

// -- telemetry ----------------------------------------------------------------------------------
function metric(label, value, unit) {
  return el("div", { class: "metric" }, el("span", { class: "muted small" }, label), el("b", {}, value == null ? "–" : `${value}${unit}`));
}

async function refreshTelemetry() {
  const t = await getJSON("/api/telemetry");
  const box = $("#telemetry");
  if (!t.available) {
    box.className = "muted";
    setText(box, `No GPU telemetry: ${t.reason || t.error || "unavailable"}${t.hint ? " — " + t.hint : ""}`);
    return;
  }
  box.className = "";
  const gpus = (t.sample && t.sample.gpus) || [];
  box.replaceChildren(...gpus.map((g) => {
    const mem = g.memory || {};
    const used = mem.used_bytes != null ? (mem.used_bytes / 1e9).toFixed(1) : null;
    return el("div", { class: "gpu" },
      metric(`GPU ${g.index} util`, g.util_gpu_pct, " %"),
      metric("power", g.power_w != null ? g.power_w.toFixed(0) : null, " W"),
      metric("temp", g.temp_gpu_c, " °C"),
      metric("SM clock", g.sm_clock_mhz, " MHz"),
      metric("memory used", used, " GB"),
      metric("throttled", g.throttled == null ? null : g.throttled ? "yes" : "no", ""));
  }));
}

// -- history ------------------------------------------------------------------------------------
async function refreshHistory() {
  const h = await getJSON("/api/history");
  const runs = h.runs || [];
  $("#history tbody").replaceChildren(...runs.map((r) => el("tr", {},
    el("td", {}, r.benchmark), el("td", {}, r.file), el("td", {}, new Date(r.mtime * 1000).toLocaleString()),
    el("td", { class: r.signed ? "ok" : "muted" }, r.signed ? "signed" : "-"),
    el("td", { class: "small" }, Object.entries(r.summary || {}).slice(0, 4).map(([k, v]) => `${k}=${v}`).join("  ")))));
  $("#history-empty").hidden = runs.length > 0;
}

// -- token / agent ------------------------------------------------------------------------------
function showTokenState(text) { setText($("#token-state"), text); }
function renderToken() {
  showTokenState(token ? "Actions are unlocked for this tab." :
    "Run, Swap and Stop need the agent's token: run `metralectl agent url` on this machine and open that address, or paste the token here.");
  $("#token-form").hidden = !!token;
  $("#token-card").hidden = !!token;  // the notice is for a read-only page: first on it, gone once unlocked
  renderServing();
  renderRecipeButtons();
}

async function refreshAgent() {
  const a = await getJSON("/api/agent");
  setText($("#agent"), a.fingerprint ? `agent ${a.version} · ${a.fingerprint}` : "agent: not answering");
}

function every(ms, fn) { const tick = () => fn().catch(() => {}).finally(() => setTimeout(tick, ms)); tick(); }

document.addEventListener("DOMContentLoaded", () => {
  takeTokenFromFragment();
  renderToken();
  // The address `metralectl agent url` prints, opened in a tab that already shows the page, changes
  // only the fragment: no reload, so take the token (and clear the address bar) here too.
  window.addEventListener("hashchange", () => { takeTokenFromFragment(); renderToken(); });
  $("#token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const v = $("#token-input").value.trim();
    if (v) { token = v; sessionStorage.setItem("metralectl-token", v); $("#token-input").value = ""; renderToken(); }
  });
  setUpConfirm();
  $("#action-error-close").addEventListener("click", () => showActionError(""));
  refreshAgent().catch(() => {});
  every(2000, refreshCapability);
  every(3000, refreshServing);
  every(60000, refreshRecipes);
  every(1000, refreshTelemetry);
  every(15000, refreshHistory);
});
