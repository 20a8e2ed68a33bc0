// The job log's rows: each lifecycle event (metralectl/lifecycle/events.py, as the API's JSON) as the step
// it belongs to ("pull weights", "start container", "wait ready"), a human label and its detail — never
// the internal event name. Pure: it returns plain values; app.js writes them with textContent only (the
// detail may come from an engine's log or a peer, so it is never HTML).
"use strict";

// Step(name) -> [the human step, what is being done]. A name this page does not know is shown as it is.
const JOB_STEPS = {
  image: ["check image", "checking"],
  weights: ["check weights", "checking"],
  port: ["check port", "checking"],
  replaced: ["stop what serves", "stopped"],
  starting: ["start container", "creating"],
  health: ["wait ready", "health"],
  holding: ["wait ready", "holding"],
  request: ["wait ready", "test request"],
  draining: ["drain requests", "waiting"],
  staging: ["start new model", "staging"],
  repair: ["repair swap", "repairing"],
  repaired: ["repair swap", "repaired"],
  stopping: ["stop container", "stopping"],
  node: ["check nodes", "node"],
  probe: ["check network", "probing"],
  network: ["check network", "network"],
  roce: ["check network", "RoCE interface"],
  rdma: ["check network", "RDMA"],
  symmetry: ["check ranks", "compared"],
};
const WEIGHTS_PHASES = { resolve: "resolving", download: "downloading", verify: "verifying", done: "verified", note: "note" };

function jobPercent(done, total) {
  return total ? ` ${Math.round((100 * (done || 0)) / total)} %` : "";
}

// One event -> {step, label, detail, key}; `step` is the step it happened in for events that carry none
// (a failure, a warning). Equal keys of consecutive rows: the later replaces the earlier (progress).
function jobLogRow(e, step) {
  const kind = String(e && e.kind);
  if (kind === "Step") {
    const [human, label] = JOB_STEPS[e.name] || [String(e.name || "step"), ""];
    return { step: human, label, detail: e.detail || "" };
  }
  if (kind === "Transfer") {
    const p = (e.progress && typeof e.progress === "object") ? e.progress : {};
    if (e.transfer === "weights") {
      const label = WEIGHTS_PHASES[p.phase] || String(p.phase || "");
      const files = p.files_total ? ` · ${p.files_done || 0}/${p.files_total} files` : "";
      return { step: "pull weights", label, key: `weights ${p.repo} ${p.phase}`,
               detail: `${p.repo || ""}${jobPercent(p.done, p.total)}${files}${p.message ? " — " + p.message : ""}` };
    }
    if (e.transfer === "image") {
      return { step: "pull image", label: String(p.status || ""), key: `image ${p.ref} ${p.layer} ${p.status}`,
               detail: `${p.ref || ""}${p.layer ? " layer " + p.layer : ""}${jobPercent(p.current, p.total)}` };
    }
    return { step: "transfer", label: String(e.transfer || ""), detail: p.text || "" };
  }
  if (kind === "ContainerStarted") {
    return { step: "start container", label: "started", detail: `${e.name || ""} (run ${e.run_id || "?"})` };
  }
  if (kind === "Phase") {
    const elapsed = typeof e.elapsed_s === "number" ? `  [${e.elapsed_s.toFixed(1)} s]` : "";
    const rank = e.rank != null ? `rank ${e.rank}: ` : "";
    return { step: "wait ready", label: `engine ${e.phase || "phase"}`, detail: `${rank}${String(e.line || "").trim()}${elapsed}` };
  }
  if (kind === "LogLine") {
    return { step: "engine log", label: e.rank != null ? `rank ${e.rank}` : "", detail: e.line || "" };
  }
  if (kind === "Ready") {
    const elapsed = typeof e.elapsed_s === "number" ? ` in ${e.elapsed_s.toFixed(1)} s` : "";
    return { step: "wait ready", label: "ready", detail: `${e.url || ""}${e.model ? " (" + e.model + ")" : ""}${elapsed}` };
  }
  if (kind === "Failed") {
    return { step, label: `failed (${e.cause || "?"})`, failed: true,
             detail: `${e.message || ""}${e.remedy ? " — fix: " + e.remedy : ""}` };
  }
  if (kind === "Warning") return { step, label: "warning", warn: true, detail: e.message || "" };
  return { step, label: "note", detail: e.text || e.message || "" };
}

function jobLogRows(events) {
  const rows = [];
  let step = "start";
  for (const e of events || []) {
    const row = jobLogRow(e, step);
    step = row.step;
    const last = rows[rows.length - 1];
    if (row.key && last && last.key === row.key) rows[rows.length - 1] = row;
    else rows.push(row);
  }
  return rows;
}

if (typeof module !== "undefined") module.exports = { jobLogRow, jobLogRows, JOB_STEPS };  // for the tests (node)
