/* Rollplan dashboard: the compare page, /ui/compare?runs=a,b,c (1–8 runs; the runs page
 * links here with 2–8). The runs' timelines overlaid, one series per run and one colour per
 * run throughout the page, on one x axis: the union of the runs' steps, with null where a run
 * has no such step (uPlot needs one shared x array). Then the runs' headline numbers and
 * their per-domain batch shares side by side. Every chart keeps the exact series it plots in
 * its container's data-series attribute (lineChart in dashboard.js). Loaded after dashboard.js. */
"use strict";

(() => {
  const { api, apiAll, el, fmt, pct, status, lineChart, schedule, COLORS } = RP;
  const MAX = 8;
  // Chart container → [the value of one timeline step, lineChart options].
  const CHARTS = [
    ["chart-effective", s => s.effective_ratio, { y: { range: [0, 1] }, yLabel: "informative / rollouts" }],
    ["chart-informative", s => s.informative_rollouts, { yLabel: "rollouts" }],
    ["chart-wasted", s => s.wasted_rollouts, { yLabel: "rollouts" }],
    ["chart-reward", s => s.mean_reward, { yLabel: "mean reward" }],
    ["chart-brier", s => (s.calibration ? s.calibration.brier : null), { y: { range: [0, 1] }, yLabel: "Brier" }],
    ["chart-compute", s => (s.plan ? s.plan.compute_ms : null), { yLabel: "ms" }],
  ];

  function runIds() {
    const raw = new URLSearchParams(location.search).get("runs") || "";
    return [...new Set(raw.split(",").map(s => s.trim()).filter(Boolean))];
  }

  const color = (i) => COLORS[i % COLORS.length];
  const swatch = (i) => el("span", { class: "swatch", style: "background:" + color(i) });
  const domainKey = (d) => (d === null ? "" : d);  // labels are never empty: "" stands for no domain
  const domainLabel = (k) => (k === "" ? "(none)" : k);

  /* Rollout-weighted mean of the steps' raw mean rewards: the mean reward of every rollout. */
  function meanReward(steps) {
    let n = 0, sum = 0;
    for (const s of steps) if (s.rollouts && s.mean_reward !== null) { n += s.rollouts; sum += s.mean_reward * s.rollouts; }
    return n ? sum / n : null;
  }

  /* Per domain: its share of the run's planned prompts over all steps, and at the latest
   * step whose plan has a batch share. */
  function domainShares(dom) {
    const total = new Map(), last = new Map();
    let all = 0;
    for (const st of dom.items) for (const d of st.domains) {
      total.set(domainKey(d.domain), (total.get(domainKey(d.domain)) || 0) + d.planned_prompts);
      all += d.planned_prompts;
    }
    const latest = [...dom.items].reverse().find(st => st.domains.some(d => d.batch_share !== null));
    if (latest) for (const d of latest.domains) if (d.batch_share !== null) last.set(domainKey(d.domain), d.batch_share);
    const overall = new Map([...total].map(([k, v]) => [k, all ? v / all : null]));
    return { overall, last, lastStep: latest ? latest.step : null };
  }

  function comparePage() {
    const ids = runIds();
    document.getElementById("compare-ids").textContent = ids.join(" · ");
    document.title = "Rollplan — compare " + ids.join(", ");
    if (!ids.length || ids.length > MAX) {
      const msg = ids.length ? "At most " + MAX + " runs at once (" + ids.length + " given)." : "No runs given.";
      document.getElementById("compare-empty").hidden = false;
      document.getElementById("compare-empty-why").textContent = msg;
      status(msg, true);
      document.body.dataset.loaded = "1";
      return;
    }

    async function load(id) {
      const base = "/v1/runs/" + encodeURIComponent(id);
      try {
        const [run, tl, dom] = await Promise.all([api(base), apiAll(base + "/timeline"), apiAll(base + "/domains")]);
        return { id, run, steps: tl.items, byStep: new Map(tl.items.map(s => [s.step, s])), dom, shares: domainShares(dom) };
      } catch (e) {
        throw new Error(id + ": " + (e.message || e));
      }
    }

    function headRow(runs, first) {
      return el("tr", {}, el("th", {}, first), ...runs.map((r, i) => el("th", { "data-run": r.id }, swatch(i), r.id)));
    }

    function sharesTable(id, runs, keys, pick) {
      const t = document.getElementById(id);
      t.querySelector("thead").replaceChildren(headRow(runs, "domain"));
      t.querySelector("tbody").replaceChildren(...keys.map(k => el("tr", { "data-domain": k },
        el("th", {}, domainLabel(k)),
        ...runs.map(r => {
          const v = pick(r).get(k);
          return el("td", { "data-run": r.id, "data-share": v === undefined || v === null ? "" : String(v) }, v === undefined ? "–" : pct(v));
        }))));
    }

    let drawn = null;
    async function refresh() {
      const runs = await Promise.all(ids.map(load));
      const text = JSON.stringify(runs.map(r => [r.run, r.steps, r.dom]));
      if (text === drawn) return;  // nothing new: leave the page as it is
      drawn = text;
      const x = [...new Set(runs.flatMap(r => r.steps.map(s => s.step)))].sort((a, b) => a - b);
      for (const [cid, value, opts] of CHARTS) {
        lineChart(cid, x, runs.map((r, i) => ({
          label: r.id,
          color: color(i),
          values: x.map(st => { const s = r.byStep.get(st); const v = s ? value(s) : null; return v === undefined ? null : v; }),
        })), opts);
      }

      document.querySelector("#cards tbody").replaceChildren(...runs.map((r, i) => {
        const st = r.run.stats, steps = r.steps.map(s => s.step);
        return el("tr", { "data-run": r.id },
          el("td", {}, swatch(i), el("a", { href: "/ui/runs/" + encodeURIComponent(r.id) }, r.id)),
          el("td", { title: JSON.stringify(r.run.strategy.params || {}) }, r.run.strategy.name),
          el("td", { "data-card": "prompts" }, fmt(st.prompts)),
          el("td", { "data-card": "steps" }, fmt(st.steps)),
          el("td", { "data-card": "range" }, steps.length ? steps[0] + "–" + steps[steps.length - 1] : "–"),
          el("td", { "data-card": "rollouts" }, fmt(st.rollouts)),
          el("td", { "data-card": "effective" }, st.rollouts ? pct(st.informative_rollouts / st.rollouts) : "–"),
          el("td", { "data-card": "reward" }, fmt(meanReward(r.steps))));
      }));

      const keys = [...new Set(runs.flatMap(r => [...r.dom.domains.map(domainKey), ...r.shares.overall.keys()]))]
        .sort((a, b) => (a === "") - (b === "") || (a < b ? -1 : a > b ? 1 : 0));
      sharesTable("domain-shares", runs, keys, r => r.shares.overall);
      sharesTable("domain-shares-last", runs, keys, r => r.shares.last);
      document.getElementById("domain-last-steps").textContent = runs.map(r => r.id + ": " + (r.shares.lastStep ?? "–")).join(" · ");
    }
    schedule(refresh);
  }

  RP.register("compare", comparePage);
})();
