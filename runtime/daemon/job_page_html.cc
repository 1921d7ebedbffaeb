// The job page's document (job_page.h): style, body and script as raw strings, no external assets.
// The Content-Security-Policy names the script and the style by their SHA-256, so any other
// script (an injected one included) does not run. Dynamic values are set with textContent and
// setAttribute only. Hooks for tools and tests: svg.chart[data-points], polyline.curve
// [data-rank][data-steps][data-values], g.rank-bar(.straggler)[data-rank], body[data-rendered-ms]
// (performance.now() when the first view was drawn), body[data-response-ms] (when the document
// had arrived) and body[data-updates] (polls applied).
#include "runtime/daemon/job_page.h"

namespace ember::daemon {

const char kJobPageStyle[] = R"CSS(
body{font-family:sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#fff;text-decoration:none}header .grow{flex:1}
main{padding:12px 16px;max-width:1400px}
h1{font-size:20px;margin:4px 0}h2{font-size:15px;margin:14px 0 6px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:12px}
section{background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px 12px}
svg.chart,svg.bars{width:100%;height:auto;display:block}
table{border-collapse:collapse;font-size:13px;width:100%}
td,th{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;vertical-align:top}
.state{font-weight:bold}.FAILED,.straggler-label{color:#c62828}.SUCCEEDED{color:#2e7d32}
.RUNNING{color:#1565c0}.muted{color:#777}
pre{background:#111;color:#ddd;padding:8px;max-height:360px;overflow:auto;font-size:12px;margin:0}
form.login{max-width:360px;margin:60px auto;background:#fff;padding:16px;border:1px solid #ddd}
form.login input{width:100%;box-sizing:border-box;margin:6px 0;padding:6px}
.error{color:#c62828}
)CSS";

const char kJobPageBody[] = R"HTML(
<header><a href="/jobs/"><b>Ember</b></a><span class="grow" id="crumb"></span>
<a href="/logout">log out</a></header>
<main id="list-view" hidden><h1>Jobs</h1>
<table id="jobs"><thead><tr><th>job</th><th>state</th><th>ranks</th><th>step</th><th>loss</th>
<th>submitted</th></tr></thead><tbody></tbody></table></main>
<main id="job-view" hidden>
<h1 id="job-title"></h1><div><span id="job-state" class="state"></span>
<span id="job-progress" class="muted"></span></div><div id="job-reason" class="error"></div>
<div class="grid">
<section><h2>Loss</h2><svg id="chart-loss" class="chart" data-points="0"></svg></section>
<section><h2>Tokens/s</h2><svg id="chart-tokens_per_s" class="chart" data-points="0"></svg></section>
<section><h2><select id="metric-pick"></select></h2>
<svg id="chart-pick" class="chart" data-points="0"></svg></section>
<section><h2>Step time per rank <span class="muted" id="bar-rule"></span></h2>
<svg id="bars" class="bars"></svg></section>
<section><h2>Attempts</h2><table id="attempts"><thead><tr><th>#</th><th>ran</th><th>nodes</th>
<th>last step</th><th>reason</th><th>flight recorder</th></tr></thead><tbody></tbody></table>
<h2>Checkpoints</h2><table id="checkpoints"><thead><tr><th>step</th><th>written</th><th></th></tr>
</thead><tbody></tbody></table></section>
</div>
<section><h2>Log <select id="log-rank"></select></h2><pre id="log"></pre></section>
</main>
)HTML";

const char kLoginBody[] = R"HTML(
<form class="login" method="post" action="/login" id="login-form"><h1>Ember</h1>
<p>The emberd API token (the file given as auth_token_file):</p>
<input type="password" name="token" autocomplete="current-password" autofocus>
<input type="hidden" name="next" id="next" value="/jobs/">
<p id="failed" class="error" hidden>That is not the token.</p>
<input type="submit" value="Log in"></form>
)HTML";

const char kJobPageScript[] = R"JS(
"use strict";
const $ = (id) => document.getElementById(id);
const SVGNS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4","#d62728","#2ca02c","#ff7f0e","#9467bd","#8c564b","#e377c2","#17becf"];
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = String(text);
  return e;
}
function sv(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = String(text);
  return e;
}
function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); }
function finite(v) { return typeof v === "number" && isFinite(v); }
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) return [];
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = mag;
  for (const m of [1, 2, 5, 10]) { step = m * mag; if (step >= raw) break; }
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}
function tick(v) {
  const a = Math.abs(v);
  if (a >= 1e9) return +(v / 1e9).toPrecision(4) + "G";
  if (a >= 1e6) return +(v / 1e6).toPrecision(4) + "M";
  if (a >= 1e4) return +(v / 1e3).toPrecision(4) + "k";
  return String(+v.toPrecision(4));
}
function when(ms) { return ms > 0 ? new Date(ms).toLocaleString() : "-"; }
function bytes(b) { return b >= 1e9 ? (b / 1e9).toFixed(1) + " GB" : (b / 1e6).toFixed(0) + " MB"; }

function drawChart(svg, series) {
  clear(svg);
  const W = 640, H = 260, L = 56, R = W - 12, T = 10, B = H - 28;
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, total = 0;
  const ranks = (series && series.ranks) || [];
  for (const r of ranks) for (let i = 0; i < r.step.length; i++) {
    if (!finite(r.last[i])) continue;
    x0 = Math.min(x0, r.step[i]); x1 = Math.max(x1, r.step[i]);
    y0 = Math.min(y0, finite(r.min[i]) ? r.min[i] : r.last[i]);
    y1 = Math.max(y1, finite(r.max[i]) ? r.max[i] : r.last[i]);
  }
  if (x0 > x1) {
    svg.appendChild(sv("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#777"},
                       "no points yet"));
    svg.setAttribute("data-points", "0");
    return;
  }
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = y0 === 0 ? 1 : Math.abs(y0) * 0.1; y0 -= d; y1 += d; }
  const m = (y1 - y0) * 0.05; y0 -= m; y1 += m;
  const X = (x) => L + (x - x0) / (x1 - x0) * (R - L), Y = (y) => B - (y - y0) / (y1 - y0) * (B - T);
  const grid = sv("g", {stroke: "#e6e6e6"}), labels = sv("g", {fill: "#444", "font-size": 11});
  for (const v of niceTicks(x0, x1, 8)) {
    grid.appendChild(sv("line", {x1: X(v), x2: X(v), y1: T, y2: B}));
    labels.appendChild(sv("text", {x: X(v), y: B + 14, "text-anchor": "middle", class: "xtick"}, tick(v)));
  }
  for (const v of niceTicks(y0, y1, 5)) {
    grid.appendChild(sv("line", {x1: L, x2: R, y1: Y(v), y2: Y(v)}));
    labels.appendChild(sv("text", {x: L - 5, y: Y(v) + 4, "text-anchor": "end", class: "ytick"}, tick(v)));
  }
  labels.appendChild(sv("text", {x: (L + R) / 2, y: H - 2, "text-anchor": "middle"}, "step"));
  svg.appendChild(grid);
  svg.appendChild(sv("path", {d: "M" + L + " " + T + "V" + B + "H" + R, stroke: "#333", fill: "none"}));
  svg.appendChild(labels);
  ranks.forEach((r, k) => {
    const color = COLORS[k % COLORS.length];
    let coarse = false;
    for (let i = 0; i < r.step.length; i++) coarse = coarse || r.first_step[i] !== r.step[i];
    if (coarse) {  // each bucket's min..max: spikes stay visible however many steps a pixel holds
      const up = [], down = [];
      for (let i = 0; i < r.step.length; i++) {
        if (finite(r.max[i])) up.push(X(r.step[i]).toFixed(1) + "," + Y(r.max[i]).toFixed(1));
        if (finite(r.min[i])) down.unshift(X(r.step[i]).toFixed(1) + "," + Y(r.min[i]).toFixed(1));
      }
      svg.appendChild(sv("polygon", {class: "band", fill: color, "fill-opacity": 0.2,
                                     points: up.concat(down).join(" ")}));
    }
    const pts = [], steps = [], values = [];
    for (let i = 0; i < r.step.length; i++) {
      if (!finite(r.last[i])) continue;
      pts.push(X(r.step[i]).toFixed(1) + "," + Y(r.last[i]).toFixed(1));
      steps.push(r.step[i]); values.push(r.last[i]);
    }
    total += values.length;
    svg.appendChild(sv("polyline", {class: "curve", "data-rank": r.rank, "data-steps": steps.join(","),
                                    "data-values": values.join(","), fill: "none", stroke: color,
                                    "stroke-width": 1.5, points: pts.join(" ")}));
    if (ranks.length > 1)
      svg.appendChild(sv("text", {x: R - 60, y: T + 12 + 13 * k, fill: color, "font-size": 11},
                         "rank " + r.rank));
  });
  svg.setAttribute("data-points", String(total));
}

function drawBars(svg, ranks) {
  clear(svg);
  const W = 640, row = 22, L = 56, R = W - 230, H = Math.max(1, ranks.length) * row + 8;
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  const max = Math.max(1e-9, ...ranks.map((r) => finite(r.step_s) ? r.step_s : 0));
  ranks.forEach((r, i) => {
    const y = 4 + i * row, s = finite(r.step_s) ? r.step_s : 0, w = finite(r.comm_wait_s) ? r.comm_wait_s : 0;
    const g = sv("g", {class: "rank-bar" + (r.straggler ? " straggler" : ""), "data-rank": r.rank,
                       "data-step-ms": (1e3 * s).toFixed(2), "data-busy-ms": (1e3 * (r.busy_s || 0)).toFixed(2)});
    g.appendChild(sv("text", {x: 4, y: y + 14, "font-size": 12}, "rank " + r.rank));
    const busyW = (s - w) / max * (R - L), waitW = w / max * (R - L);
    g.appendChild(sv("rect", {x: L, y: y, width: Math.max(0, busyW), height: row - 6,
                              fill: r.straggler ? "#c62828" : "#1f77b4"}));
    g.appendChild(sv("rect", {x: L + Math.max(0, busyW), y: y, width: Math.max(0, waitW), height: row - 6,
                              fill: "#b0bec5"}));
    const text = r.lines > 0 ? (1e3 * s).toFixed(1) + " ms, " + (s > 0 ? Math.round(100 * w / s) : 0) +
                 "% comm, step " + r.step + ", " + bytes(r.peak_rss_bytes || 0) : "no steps logged";
    g.appendChild(sv("text", {x: R + 4, y: y + 14, "font-size": 11}, text));
    if (r.straggler)
      g.appendChild(sv("text", {x: L + 4, y: y + 13, "font-size": 11, fill: "#fff",
                                class: "straggler-label"}, "straggler"));
    svg.appendChild(g);
  });
}

function renderDetail(d) {
  document.title = d.name + " - Ember";
  $("crumb").textContent = d.id;
  $("job-title").textContent = d.name + " (" + d.id + ")";
  $("job-state").textContent = d.state;
  $("job-state").className = "state " + d.state;
  const p = d.progress || {};
  $("job-progress").textContent = " step " + (p.step || 0) + "/" + (p.steps || 0) + ", " +
      d.world_size + " x " + d.device_type + (finite(p.loss) ? ", loss " + p.loss.toFixed(4) : "") +
      (finite(p.tokens_per_s) ? ", " + Math.round(p.tokens_per_s) + " tok/s" : "");
  $("job-reason").textContent = d.reason || "";
  $("bar-rule").textContent = "(bar: own time, grey: comm wait; straggler: " + d.straggler_rule + ")";
  drawBars($("bars"), d.ranks || []);
  const at = $("attempts").tBodies[0]; clear(at);
  for (const a of d.attempts || []) {
    const ran = a.end_unix_ms > 0 ? ((a.end_unix_ms - a.start_unix_ms) / 1e3).toFixed(1) + " s" : "running";
    const tr = el("tr", {class: "attempt", "data-number": a.number});
    for (const t of [a.number, ran, (a.nodes || []).join(", "), a.last_step || "-", a.reason || "", a.verdict || ""])
      tr.appendChild(el("td", {}, t));
    at.appendChild(tr);
  }
  const ct = $("checkpoints").tBodies[0]; clear(ct);
  for (const c of d.checkpoints || []) {
    const tr = el("tr", {class: "checkpoint"});
    for (const t of [c.step, when(c.unix_ms), c.latest ? "latest" : ""]) tr.appendChild(el("td", {}, t));
    ct.appendChild(tr);
  }
  if (!(d.checkpoints || []).length) ct.appendChild(el("tr", {}, "none yet"));
  const sel = $("log-rank");
  if (sel.options.length !== d.world_size) {
    clear(sel);
    for (let r = 0; r < d.world_size; r++) sel.appendChild(el("option", {value: r}, "rank " + r));
  }
}

function renderLogs(l) {
  const pre = $("log");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = l.on_this_node ? l.lines.join("\n") : "(this rank's log is on another node)";
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

function renderList(l) {
  const tb = $("jobs").tBodies[0]; clear(tb);
  for (const j of l.jobs || []) {
    const tr = el("tr", {class: "job"});
    const a = el("a", {href: "/jobs/" + encodeURIComponent(j.id)}, j.id);
    const td = el("td"); td.appendChild(a); tr.appendChild(td);
    for (const t of [j.state, j.world_size + " x " + j.device_type, j.step + "/" + j.steps,
                     finite(j.loss) ? j.loss.toFixed(4) : "-", when(j.submit_unix_ms)])
      tr.appendChild(el("td", {}, t));
    tr.children[1].className = "state " + j.state;
    tb.appendChild(tr);
  }
}

async function getJson(path) {
  const r = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  if (r.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); throw 0; }
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

// When the first view was drawn, and when the document had arrived, in ms since navigation start.
function markRendered() {
  document.body.setAttribute("data-rendered-ms", performance.now().toFixed(1));
  const nav = performance.getEntriesByType("navigation")[0];
  if (nav) document.body.setAttribute("data-response-ms", nav.responseEnd.toFixed(1));
}

function loginPage() {
  const q = new URLSearchParams(location.search);
  const next = q.get("next") || "";
  if (next.startsWith("/jobs/")) $("next").value = next;
  $("failed").hidden = q.get("failed") !== "1";
}

function jobPage(init) {
  const id = decodeURIComponent(location.pathname.slice("/jobs/".length));
  const api = "/api/jobs/" + encodeURIComponent(id);
  $("job-view").hidden = false;
  // Any series (every numeric field of jobs.v1.StepMetrics, listed by the server) in a third chart.
  const pick = $("metric-pick");
  for (const m of init.metrics || []) pick.appendChild(el("option", {value: m}, m));
  pick.value = init.pick || "";
  const apply = (d, loss, tps, picked, logs) => {
    renderDetail(d);
    drawChart($("chart-loss"), loss);
    drawChart($("chart-tokens_per_s"), tps);
    drawChart($("chart-pick"), picked);
    $("chart-pick").setAttribute("data-metric", (picked && picked.metric) || "");
    renderLogs(logs);
  };
  if (init.detail) apply(init.detail, init.loss, init.tokens_per_s, init[init.pick], init.logs);
  else $("job-title").textContent = "no job " + id;
  markRendered();
  let updates = 0, state = init.detail ? init.detail.state : "";
  const done = () => ["SUCCEEDED", "FAILED", "CANCELLED"].includes(state);
  $("log-rank").addEventListener("change", () => poll());
  pick.addEventListener("change", () => poll());
  async function poll() {
    try {
      const rank = $("log-rank").value || 0;
      const [d, loss, tps, picked, logs] = await Promise.all([
        getJson(api), getJson(api + "/series?metric=loss&max_points=1000"),
        getJson(api + "/series?metric=tokens_per_s&max_points=1000"),
        getJson(api + "/series?metric=" + encodeURIComponent(pick.value) + "&max_points=1000"),
        getJson(api + "/logs?rank=" + rank + "&tail=200")]);
      apply(d, loss, tps, picked, logs);
      state = d.state;
      document.body.setAttribute("data-updates", String(++updates));
    } catch (e) { if (e) console.log(e); }
  }
  (function loop() { setTimeout(async () => { await poll(); if (!done()) loop(); }, 2000); })();
}

function listPage(init) {
  $("list-view").hidden = false;
  if (init.list) renderList(init.list);
  markRendered();
  setInterval(() => getJson("/api/jobs").then(renderList).catch(() => {}), 5000);
}

if ($("login-form")) loginPage();
else {
  const init = JSON.parse($("initial").textContent || "{}");
  if (location.pathname.length > "/jobs/".length) jobPage(init); else listPage(init);
}
)JS";

}  // namespace ember::daemon
