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
  if (!token) { showTokenState("Actions need the agent's token: run `metralectl agent url` and open that address."); return null; }
  const r = await fetch(path, {
    method: "POST", cache: "no-store", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "Authorization": `Bearer ${token}` },
    body: JSON.stringify(body),
  });
  const answer = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (r.status === 401) { token = ""; sessionStorage.removeItem("metralectl-token"); }
  if (!r.ok) {
    alert(`${clean(answer.error || r.status, TEXT_LIMIT)}${answer.hint ? "\n\nhint: " + clean(answer.hint, TEXT_LIMIT) : ""}`);
    renderToken();
    return null;
  }
  return answer;
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
  card.classList.remove("ready", "cannot", "checking");
  const list = $("#cap-problems");
  list.replaceChildren();
  if (cap.can_run === true) {
    card.classList.add("ready");
    setText($("#cap-title"), "Ready: this machine can run models");
  } else if (cap.can_run === false) {
    card.classList.add("cannot");
    setText($("#cap-title"), "This machine cannot run models");
    for (const p of cap.problems || []) {
      list.append(el("li", {}, el("strong", {}, p.title || p.id), ": ", p.detail || "",
        p.remedy ? el("span", { class: "remedy" }, p.remedy) : ""));
    }
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
  renderServing();
  $("#serving-empty").hidden = serving.length > 0 || !!s.error;
  if (s.degraded) { err.hidden = false; setText(err, `DEGRADED: ${s.degraded}`); }
  renderRecipeButtons();
}

function renderServing() {
  $("#serving tbody").replaceChildren(...serving.map((x) => el("tr", {},
    el("td", {}, x.recipe), el("td", {}, x.name), el("td", {}, x.state), el("td", {}, x.health),
    el("td", {}, x.uptime), el("td", {}, x.endpoint),
    el("td", {}, el("button", { class: "danger", ...actionAttrs(() => act("/api/stop", { recipe: x.recipe })) },
      "Stop")))));
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

function renderRecipeButtons() {
  const busy = currentJob && !FINISHED.includes(currentJob.state);
  const body = $("#recipes tbody");
  body.replaceChildren(...recipes.map((x) => {
    const isServed = serving.some((s) => s.recipe === x.name && s.state.startsWith("running"));
    const action = serving.length ? ["Swap to", "/api/swap"] : ["Run", "/api/run"];
    return el("tr", {},
      el("td", {}, x.name), el("td", {}, x.model), el("td", {}, x.quant), el("td", {}, x.hardware),
      el("td", { class: x.fits === false ? "bad" : x.fits ? "ok" : "muted", title: x.fits_reason || "" },
        x.fits === null ? "?" : x.fits ? "yes" : "no"),
      el("td", {}, x.weights), el("td", {}, x.validated_tok_s ?? "-"),
      el("td", {}, isServed ? el("span", { class: "ok" }, "serving")
        : el("button", actionAttrs(() => act(action[1], { recipe: x.name }), busy), action[0])));
  }));
}

// -- jobs ---------------------------------------------------------------------------------------
async function act(path, body) {
  const job = await post(path, body);
  if (job) { currentJob = job; followJob(); }
}

const FINISHED = ["done", "failed", "cancelled"];

function progressText(p) {
  if (!p || typeof p !== "object") return "";
  const done = p.done ?? p.current, total = p.total;  // weights.PullEvent / images.LayerProgress
  const what = [p.repo || p.ref || "", p.layer || "", p.phase || p.status || ""].filter(Boolean).join(" ");
  return total ? `${what} ${Math.round((100 * (done || 0)) / total)} %` : what;
}

async function followJob() {
  if (!currentJob) return;
  const j = await getJSON(`/api/jobs/${encodeURIComponent(currentJob.id)}`);
  if (!j.error) currentJob = j;
  $("#job-card").hidden = false;
  setText($("#job-title"), `${currentJob.kind} ${currentJob.target || ""}`);
  setText($("#job-state"), currentJob.state + (currentJob.error ? `: ${currentJob.error}` : "") +
    (currentJob.hint ? ` (hint: ${currentJob.hint})` : ""));
  $("#job-state").className = ["failed", "cancelled"].includes(currentJob.state) ? "error" : currentJob.state === "done" ? "ok" : "";
  $("#job-events").textContent = (currentJob.events || []).map((e) =>  // one cleaned line per event
    clean(`${String(e.kind).padEnd(16)} ${e.detail || e.line || e.message || e.name || e.phase || progressText(e.progress)}`,
      TEXT_LIMIT)).join("\n");
  renderRecipeButtons();
  if (!FINISHED.includes(currentJob.state)) setTimeout(followJob, 1000);
  else refreshServing();
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
    "Read-only: actions need the agent's token (run `metralectl agent url` on this machine and open that address, or paste the token).");
  $("#token-form").hidden = !!token;
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
  refreshAgent().catch(() => {});
  every(2000, refreshCapability);
  every(3000, refreshServing);
  every(60000, refreshRecipes);
  every(1000, refreshTelemetry);
  every(15000, refreshHistory);
});
