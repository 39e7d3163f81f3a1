/* Rollplan dashboard. Plain JavaScript, no build step: reads the JSON inspection
 * API and draws with uPlot (vendored) and a canvas heatmap. Every chart keeps the
 * exact series it plots in its container's data-series attribute (JSON), so what
 * is drawn can be checked against the API. */
"use strict";

const RP = (() => {
  const COLORS = ["#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0"];
  const params = new URLSearchParams(location.search);
  const REFRESH = params.has("refresh") ? Number(params.get("refresh")) : 5;
  const charts = {};

  function keyHeader() {
    const k = localStorage.getItem("rollplan.key");
    return k ? { Authorization: "Bearer " + k } : {};
  }

  async function api(path) {
    const r = await fetch(path, { headers: keyHeader() });
    if (r.status === 401) {
      const k = prompt("This Rollplan server needs an API key:");
      if (k) { localStorage.setItem("rollplan.key", k); return api(path); }
    }
    if (!r.ok) {
      let detail = r.statusText;
      try { detail = (await r.json()).detail || detail; } catch (e) { /* not JSON */ }
      throw new Error(r.status + " " + detail);
    }
    return r.json();
  }

  /* Follow next_cursor through every page; merge items. */
  async function apiAll(path) {
    let first = null, cursor = null;
    do {
      const sep = path.includes("?") ? "&" : "?";
      const page = await api(path + (cursor ? sep + "cursor=" + encodeURIComponent(cursor) : ""));
      if (first === null) first = page; else first.items.push(...page.items);
      cursor = page.next_cursor;
    } while (cursor);
    first.next_cursor = null;
    return first;
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
    return e;
  }

  const fmt = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : (Number.isInteger(x) ? x.toLocaleString("en") : Number(x).toFixed(d));
  const pct = (x) => (x === null || x === undefined) ? "–" : (100 * x).toFixed(1) + "%";

  function status(msg, bad) {
    const s = document.getElementById("status");
    if (s) { s.textContent = msg; s.classList.toggle("bad", !!bad); }
  }

  function card(label, value, id) {
    return el("div", { class: "card", "data-card": id }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
  }

  /* A uPlot line chart; x: numbers, series: [{label, values, color?, dash?, points?}]. */
  function lineChart(id, x, series, opts = {}) {
    const box = document.getElementById(id);
    box.setAttribute("data-series", JSON.stringify({ x, series: Object.fromEntries(series.map(s => [s.label, s.values])) }));
    const data = [x, ...series.map(s => s.values)];
    const shape = series.map(s => s.label).join("|");
    const prev = charts[id];
    if (prev && prev.shape === shape) { prev.plot.setData(data); return; }
    if (prev) prev.plot.destroy();
    box.textContent = "";
    if (!x.length) { box.append(el("div", { class: "empty" }, "no data yet")); delete charts[id]; return; }
    const plot = new uPlot({
      width: Math.max(300, box.clientWidth - 4),
      height: opts.height || 220,
      scales: { x: { time: false }, y: opts.y || {} },
      // Steps and group numbers are integers: ticks only at whole numbers.
      axes: [{ label: opts.xLabel || "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 1e5, 1e6] },
        { label: opts.yLabel || "" }],
      series: [{ label: opts.xLabel || "step" }, ...series.map((s, i) => ({
        label: s.label,
        stroke: s.color || COLORS[i % COLORS.length],
        width: s.width || 1.5,
        dash: s.dash,
        points: { show: s.points !== undefined ? s.points : x.length < 60 },
        paths: s.points === "only" ? () => null : undefined,
        spanGaps: true,
      }))],
    }, data, box);
    charts[id] = { plot, shape };
  }

  /* Viridis-like colour ramp for the heatmap. */
  const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function ramp(t) {
    t = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
    const i = Math.min(RAMP.length - 2, Math.floor(t)), f = t - i;
    const c = RAMP[i].map((v, k) => Math.round(v + f * (RAMP[i + 1][k] - v)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function heatmap(id, steps, counts, edges) {
    const box = document.getElementById(id);
    box.setAttribute("data-series", JSON.stringify({ steps, counts, edges }));
    const cv = box.querySelector("canvas");
    const W = Math.max(300, box.clientWidth - 4), H = 260, L = 48, B = 28, T = 6, R = 10;
    const dpr = window.devicePixelRatio || 1;
    cv.width = W * dpr; cv.height = H * dpr; cv.style.width = W + "px"; cv.style.height = H + "px";
    const g = cv.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, W, H);
    g.font = "11px system-ui, sans-serif"; g.fillStyle = "#555";
    if (!steps.length) { g.fillText("no data yet", L, H / 2); return; }
    const nb = edges.length - 1, pw = (W - L - R) / steps.length, ph = (H - T - B) / nb;
    steps.forEach((st, i) => {
      const total = counts[i].reduce((a, b) => a + b, 0) || 1;
      counts[i].forEach((c, j) => {
        g.fillStyle = ramp(Math.sqrt(c / total));
        g.fillRect(L + i * pw, H - B - (j + 1) * ph, Math.ceil(pw), Math.ceil(ph));
      });
    });
    g.fillStyle = "#333";
    g.textAlign = "right"; g.textBaseline = "middle";
    for (let j = 0; j <= nb; j += Math.max(1, Math.round(nb / 5))) g.fillText(edges[j].toFixed(1), L - 4, H - B - j * ph);
    g.textAlign = "center"; g.textBaseline = "top";
    const every = Math.max(1, Math.ceil(steps.length / 12));
    steps.forEach((st, i) => { if (i % every === 0) g.fillText(String(st), L + (i + 0.5) * pw, H - B + 4); });
    g.save(); g.translate(12, (H - B) / 2); g.rotate(-Math.PI / 2); g.fillText("predicted pass rate", 0, 0); g.restore();
  }

  function fillTable(id, rows) {
    const tb = document.querySelector("#" + id + " tbody");
    tb.replaceChildren(...rows);
  }

  function schedule(fn) {
    const tick = async () => {
      try { await fn(); status(REFRESH > 0 ? "live · refreshed " + new Date().toLocaleTimeString() : "loaded"); }
      catch (e) { status(String(e.message || e), true); }
      document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
      if (REFRESH > 0) setTimeout(tick, REFRESH * 1000);
    };
    tick();
  }

  // -- runs page ----------------------------------------------------------------------
  async function runsPage() {
    let cursor = null;
    const more = document.getElementById("more-runs");
    async function load(append) {
      const page = await api("/v1/runs?limit=100" + (append && cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
      const rows = page.items.map(r => el("tr", { "data-run": r.id },
        el("td", {}, el("a", { href: "/ui/runs/" + encodeURIComponent(r.id) }, r.id)),
        el("td", {}, r.strategy.name), el("td", {}, fmt(r.stats.prompts)), el("td", {}, fmt(r.stats.steps)),
        el("td", {}, fmt(r.stats.rollouts)),
        el("td", {}, r.stats.rollouts ? pct(r.stats.informative_rollouts / r.stats.rollouts) : "–"),
        el("td", {}, new Date(r.created_at).toLocaleString())));
      const tb = document.querySelector("#runs tbody");
      if (append) tb.append(...rows); else tb.replaceChildren(...rows);
      cursor = page.next_cursor; more.hidden = !cursor;
    }
    more.onclick = () => load(true);
    schedule(() => load(false));
  }

  // -- run page -----------------------------------------------------------------------
  function runIdFromPath() { return decodeURIComponent(location.pathname.split("/")[3]); }

  async function runPage() {
    const runId = runIdFromPath();
    const base = "/v1/runs/" + encodeURIComponent(runId);
    document.getElementById("run-id").textContent = runId;
    document.title = "Rollplan — " + runId;
    let promptCursor = null, domainsKnown = "";

    async function loadPrompts(append) {
      const f = new FormData(document.getElementById("prompt-filter"));
      const q = new URLSearchParams({ limit: "50" });
      for (const [k, v] of f.entries()) if (v !== "") q.set(k, v);
      if (append && promptCursor) q.set("cursor", promptCursor);
      const page = await api(base + "/prompts?" + q);
      const rows = page.items.map(p => el("tr", { "data-prompt": p.id },
        el("td", {}, el("a", { href: "/ui/runs/" + encodeURIComponent(runId) + "/prompts/" + encodeURIComponent(p.id) }, p.id)),
        el("td", {}, p.domain ?? "–"), el("td", {}, el("span", { class: "state " + p.state }, p.state)),
        el("td", {}, fmt(p.predicted_pass_rate)), el("td", {}, fmt(p.rollouts)), el("td", {}, fmt(p.mean_reward)),
        el("td", {}, p.last_step ?? "–")));
      const tb = document.querySelector("#prompts tbody");
      if (append) tb.append(...rows); else tb.replaceChildren(...rows);
      promptCursor = page.next_cursor;
      document.getElementById("more-prompts").hidden = !promptCursor;
    }
    document.getElementById("prompt-filter").onsubmit = (ev) => { ev.preventDefault(); loadPrompts(false).catch(e => status(e.message, true)); };
    document.getElementById("more-prompts").onclick = () => loadPrompts(true).catch(e => status(e.message, true));

    async function refresh() {
      const [run, tl, hist, dom] = await Promise.all([
        api(base), apiAll(base + "/timeline"), apiAll(base + "/pass-rate-histogram?bins=20"), apiAll(base + "/domains"),
      ]);
      const t = tl.items, steps = t.map(s => s.step);
      const sum = (k) => t.reduce((a, s) => a + (s[k] || 0), 0);
      const ms = t.filter(s => s.plan && s.plan.compute_ms !== null).map(s => s.plan.compute_ms);
      const briers = t.filter(s => s.calibration).map(s => s.calibration.brier);
      document.getElementById("cards").replaceChildren(
        card("strategy", run.strategy.name, "strategy"),
        card("prompts", fmt(run.stats.prompts), "prompts"),
        card("steps", fmt(run.stats.steps), "steps"),
        card("rollouts", fmt(run.stats.rollouts), "rollouts"),
        card("effective ratio", run.stats.rollouts ? pct(run.stats.informative_rollouts / run.stats.rollouts) : "–", "effective"),
        card("wasted rollouts", fmt(run.stats.rollouts - run.stats.informative_rollouts), "wasted"),
        card("frontier prompts", fmt(hist.current.states.frontier), "frontier"),
        card("mean Brier", briers.length ? fmt(briers.reduce((a, b) => a + b, 0) / briers.length) : "–", "brier"),
        card("plan compute", ms.length ? fmt(ms.reduce((a, b) => a + b, 0) / ms.length, 2) + " ms" : "–", "compute"));

      lineChart("chart-rollouts", steps, [
        { label: "rollouts", values: t.map(s => s.rollouts) },
        { label: "informative", values: t.map(s => s.informative_rollouts), color: "#3ca951" },
        { label: "wasted: all solved", values: t.map(s => s.wasted_all_solved), color: "#efb118" },
        { label: "wasted: all failed", values: t.map(s => s.wasted_all_failed), color: "#ff725c" },
      ], { yLabel: "rollouts" });
      lineChart("chart-reward", steps, [
        { label: "mean reward", values: t.map(s => s.mean_reward) },
        { label: "effective ratio", values: t.map(s => s.effective_ratio), color: "#3ca951" },
      ], { y: { range: [0, 1] } });
      lineChart("chart-calibration", steps, [
        { label: "Brier", values: t.map(s => s.calibration ? s.calibration.brier : null), color: "#a463f2" },
        { label: "mean predicted", values: t.map(s => s.calibration ? s.calibration.mean_predicted : null), color: "#97bbf5", dash: [4, 3] },
        { label: "mean observed", values: t.map(s => s.calibration ? s.calibration.mean_observed : null), color: "#9c6b4e", dash: [4, 3] },
      ], { y: { range: [0, 1] } });
      lineChart("chart-latency", steps, [
        { label: "compute ms", values: t.map(s => s.plan ? s.plan.compute_ms : null), color: "#ff8ab7" },
      ], { yLabel: "ms" });

      const h = hist.items;
      heatmap("heatmap", h.map(s => s.step), h.map(s => s.counts), hist.edges);
      const states = ["unseen", "unsolved", "frontier", "solved"];
      const stateColors = { unseen: "#9498a0", unsolved: "#ff725c", frontier: "#3ca951", solved: "#4269d0" };
      lineChart("chart-states", h.map(s => s.step), states.map(k => ({ label: k, values: h.map(s => s.states[k]), color: stateColors[k] })), { yLabel: "prompts" });

      const names = dom.domains;
      const dsteps = dom.items.filter(s => s.domains.some(d => d.batch_share !== null));
      lineChart("chart-domains", dsteps.map(s => s.step), names.map(n => ({
        label: n === null ? "(none)" : n,
        values: dsteps.map(s => { const d = s.domains.find(x => x.domain === n); return d && d.batch_share !== null ? d.batch_share : 0; }),
      })), { y: { range: [0, 1] }, yLabel: "batch share" });
      fillTable("domains", dom.current.map(d => el("tr", { "data-domain": d.domain ?? "" },
        el("td", {}, d.domain ?? "(none)"), el("td", {}, fmt(d.prompts)), el("td", {}, fmt(d.rollouts)),
        el("td", {}, fmt(d.mean_reward)), el("td", {}, fmt(d.mean_predicted_pass_rate)),
        ...states.map(k => el("td", {}, fmt(d.states[k]))))));
      const known = JSON.stringify(names);
      if (known !== domainsKnown) {
        domainsKnown = known;
        const sel = document.querySelector("#prompt-filter select[name=domain]");
        sel.replaceChildren(el("option", { value: "" }, "any"), ...names.filter(n => n !== null).map(n => el("option", { value: n }, n)));
      }

      const total = sum("rollouts"), inf = sum("informative_rollouts");
      const solved = sum("wasted_all_solved"), failed = sum("wasted_all_failed");
      const other = total - inf - solved - failed;
      fillTable("waste", [
        ["rollouts", total], ["informative", inf], ["wasted: all solved", solved], ["wasted: all failed", failed],
        ["wasted: other constant groups", other],
      ].map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, fmt(v)), el("td", {}, total ? pct(v / total) : "–"))));

      const cfg = { strategy: run.strategy, rollouts_per_prompt: run.rollouts_per_prompt, min_rollouts: run.min_rollouts,
        max_rollouts: run.max_rollouts, reward_range: run.reward_range, metadata: run.metadata };
      document.getElementById("config").textContent = JSON.stringify(cfg, null, 2);
      document.getElementById("strategy-state").textContent = Object.keys(hist.current.strategy_state).length
        ? JSON.stringify(hist.current.strategy_state, null, 2) : "(this strategy exposes no extra state)";
      if (!document.querySelector("#prompts tbody tr") || !promptCursor) await loadPrompts(false);
      if (!qualityLoaded) { qualityLoaded = true; fillQualityDomains(names); await loadQuality(); }
    }

    // -- data quality: loaded once and on "apply" (it reads the whole pool) -----------------
    let qualityLoaded = false;
    const qform = document.getElementById("quality-filter");
    function fillQualityDomains(names) {
      const sel = qform.querySelector("select[name=domain]");
      sel.replaceChildren(el("option", { value: "" }, "any"), ...names.filter(n => n !== null).map(n => el("option", { value: n }, n)));
    }
    function qualityQuery() {
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(qform)) if (v !== "") q.set(k, v);
      return q;
    }
    async function loadQuality() {
      const base = "/v1/runs/" + encodeURIComponent(runId) + "/data-quality";
      const q = qualityQuery();
      for (const f of ["csv", "jsonl"]) {
        const d = new URLSearchParams(q); d.set("format", f);
        document.getElementById("quality-" + f).href = base + "?" + d;
      }
      q.set("limit", "1000");
      const page = await apiAll(base + "?" + q);
      const c = page.counts;
      document.getElementById("quality-counts").textContent =
        "At this confidence: " + c.broken + " broken, " + c.solved + " always solved, " + c.noisy + " noisy"
        + (page.items.length ? "" : ".");
      fillTable("quality", page.items.map(i => el("tr", { "data-prompt": i.prompt_id, "data-kind": i.kind },
        el("td", {}, el("a", { href: "/ui/runs/" + encodeURIComponent(runId) + "/prompts/" + encodeURIComponent(i.prompt_id) }, i.prompt_id)),
        el("td", {}, i.domain ?? "(none)"), el("td", {}, i.kind), el("td", {}, fmt(i.confidence)),
        el("td", {}, fmt(i.groups)), el("td", {}, fmt(i.rollouts)), el("td", {}, fmt(i.passes, 1)),
        el("td", {}, fmt(i.all_pass_groups)), el("td", {}, fmt(i.all_fail_groups)), el("td", {}, i.last_step ?? "–"),
        el("td", {}, fmt(i.predicted_pass_rate)))));
      document.getElementById("quality-empty").hidden = page.items.length > 0;
    }
    qform.addEventListener("submit", (e) => { e.preventDefault(); loadQuality().catch(err => status(err.message, true)); });
    schedule(refresh);
  }

  // -- prompt page --------------------------------------------------------------------
  async function promptPage() {
    const parts = location.pathname.split("/");
    const runId = decodeURIComponent(parts[3]);
    const promptId = decodeURIComponent(parts.slice(5).join("/"));
    const link = document.getElementById("run-link");
    link.textContent = runId; link.href = "/ui/runs/" + encodeURIComponent(runId);
    document.getElementById("prompt-id").textContent = promptId;
    document.title = "Rollplan — " + promptId;

    async function refresh() {
      const p = await api("/v1/runs/" + encodeURIComponent(runId) + "/prompt-history/" + encodeURIComponent(promptId));
      const a = p.posterior.alpha, b = p.posterior.beta;
      document.getElementById("cards").replaceChildren(
        card("domain", p.domain ?? "–", "domain"), card("state", p.state, "state"),
        card("predicted pass rate", fmt(p.predicted_pass_rate), "predicted"),
        card("posterior", "Beta(" + fmt(a, 2) + ", " + fmt(b, 2) + ")", "posterior"),
        card("rollouts", fmt(p.rollouts), "rollouts"), card("groups", fmt(p.groups), "groups"),
        card("mean reward", fmt(p.mean_reward), "mean"), card("last seen", p.last_step ?? "–", "last"));
      if (p.text) { document.getElementById("text-section").hidden = false; document.getElementById("prompt-text").textContent = p.text; }
      const hs = p.history;
      // x: the step when the prompt's groups came in step order (the usual case), else the group's number.
      const byStep = hs.every((e, i) => i === 0 || e.step > hs[i - 1].step);
      const x = byStep ? hs.map(e => e.step) : hs.map((_, i) => i + 1);
      const sd = hs.map(e => { const s = e.posterior.alpha + e.posterior.beta; return Math.sqrt(e.posterior.alpha * e.posterior.beta / (s * s * (s + 1))); });
      lineChart("chart-estimate", x, [
        { label: "predicted pass rate", values: hs.map(e => e.predicted_pass_rate), width: 2 },
        { label: "− 2 sd", values: hs.map((e, i) => Math.max(0, e.predicted_pass_rate - 2 * sd[i])), color: "#97bbf5", dash: [4, 3] },
        { label: "+ 2 sd", values: hs.map((e, i) => Math.min(1, e.predicted_pass_rate + 2 * sd[i])), color: "#97bbf5", dash: [4, 3] },
        { label: "observed group mean", values: hs.map(e => e.mean_reward), color: "#ff725c", points: "only" },
      ], { y: { range: [0, 1] }, xLabel: byStep ? "step" : "reported group #" });
      fillTable("history", hs.map((e, i) => el("tr", { "data-step": e.step },
        el("td", {}, i + 1), el("td", {}, e.step), el("td", {}, e.report_id),
        el("td", { class: "rewards" }, e.rewards.map(r => fmt(r, 2)).join(" ")), el("td", {}, fmt(e.mean_reward)),
        el("td", {}, e.informative ? "yes" : "no"), el("td", {}, fmt(e.predicted_pass_rate)))));
      fillTable("planned", p.planned.map(e => el("tr", {}, el("td", {}, e.step), el("td", {}, e.rollouts), el("td", {}, fmt(e.predicted_pass_rate)))));
    }
    schedule(refresh);
  }

  const pages = { runs: runsPage, run: runPage, prompt: promptPage };
  document.addEventListener("DOMContentLoaded", () => pages[document.body.dataset.page]());
  return { api, apiAll };
})();
