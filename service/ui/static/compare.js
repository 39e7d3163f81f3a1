/* Rollplan dashboard: the compare page, /ui/compare?runs=a,b,c (1–8 runs; the runs page
 * links here with 2–8). The runs' timelines and eval metrics overlaid, one series per run
 * and one colour per run throughout the page, on one x axis (?x=): the step, the run's
 * cumulative rollouts, its cumulative completion tokens (?x=tokens; a run whose reports
 * carry no tokens has no points there), or its wall time (seconds since its first step) —
 * the union of the runs' x values, with null where a run has none (uPlot needs one shared
 * x array). Then: rollouts and tokens to reach a threshold of an eval metric (?metric=,
 * ?threshold=, ?dir=) with the ratio to a baseline run (?baseline=; in tokens when the x
 * axis is tokens, else in rollouts); wasted rollouts and tokens per run, with the rollouts
 * spent on wrong-label suspects (the data-quality view's `broken` prompts); seeds grouped
 * by a metadata key (?group=) into mean ± 1 sd; the runs' headline numbers and per-domain
 * batch shares. A run id that does not exist is named and left out. Every chart keeps the
 * exact series it plots in its container's data-series attribute (lineChart in
 * dashboard.js). Loaded after dashboard.js. */
"use strict";

(() => {
  const { api, apiAll, el, fmt, pct, status, lineChart, schedule, COLORS, setSmoothing, setParams, view } = RP;
  const MAX = 8;
  const XS = { step: "step", rollouts: "cumulative rollouts", tokens: "cumulative tokens", time: "wall time (s)" };
  // Chart container → [the value of one timeline step, lineChart options].
  const CHARTS = [
    ["chart-effective", s => s.effective_ratio, { y: { range: [0, 1] }, yLabel: "informative / rollouts" }],
    ["chart-informative", s => s.informative_rollouts, { yLabel: "rollouts", log: true }],
    ["chart-wasted", s => s.wasted_rollouts, { yLabel: "rollouts", log: true }],
    ["chart-tokens", s => s.tokens, { yLabel: "tokens", log: true }],
    ["chart-wasted-tokens", s => s.wasted_tokens, { yLabel: "tokens", log: true }],
    ["chart-reward", s => s.mean_reward, { yLabel: "mean reward" }],
    ["chart-brier", s => (s.calibration ? s.calibration.brier : null), { yLabel: "Brier" }],
    ["chart-compute", s => (s.plan ? s.plan.compute_ms : null), { yLabel: "ms", log: true }],
  ];

  const q = new URLSearchParams(location.search);
  const ui = {
    x: XS[q.get("x")] ? q.get("x") : "step",
    metric: q.get("metric") || "",
    threshold: q.get("threshold") || "",
    dir: q.get("dir") === "le" ? "le" : "ge",
    baseline: q.get("baseline") || "",
    group: q.get("group") || "",
  };

  function runIds() {
    const raw = q.get("runs") || "";
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

  /* The run's x of a step: the step, the rollouts (or completion tokens; null for a run whose
   * reports carry none) reported up to and including it, or the seconds from the run's first
   * step to it (a metric's own write time where the timeline has no such step). */
  function axes(steps, metrics) {
    const cum = [], cumTok = [], at = [];
    let n = 0, tok = 0;
    for (const s of steps) { n += s.rollouts; tok += s.tokens || 0; cum.push([s.step, n]); cumTok.push([s.step, tok]); }
    const hasTokens = steps.some(s => s.tokens !== null && s.tokens !== undefined);
    const times = steps.filter(s => s.time).map(s => [s.step, Date.parse(s.time)]);
    const t0 = Math.min(...times.map(t => t[1]), ...metrics.items.filter(m => m.time).map(m => Date.parse(m.time)));
    const timeOf = new Map(times);
    const metricTime = new Map(metrics.items.map(m => [m.step, m.time ? Date.parse(m.time) : null]));
    function cumulativeAt(points, step) {  // the last timeline step ≤ step
      let lo = 0, hi = points.length - 1, best = null;
      while (lo <= hi) { const mid = (lo + hi) >> 1; if (points[mid][0] <= step) { best = points[mid][1]; lo = mid + 1; } else hi = mid - 1; }
      return best === null ? 0 : best;
    }
    const rolloutsAt = (step) => cumulativeAt(cum, step);
    for (const s of steps) at.push(s.step);
    return {
      step: (st) => st,
      rollouts: rolloutsAt,
      tokens: (step) => (hasTokens ? cumulativeAt(cumTok, step) : null),
      time: (st) => {
        const t = timeOf.has(st) ? timeOf.get(st) : metricTime.get(st);
        return t === undefined || t === null || !Number.isFinite(t0) ? null : Math.round((t - t0) / 10) / 100;
      },
    };
  }

  /* One x array for several runs' [x, value] points: the union of the x values, each run's
   * values on it (null where it has no point). */
  function overlay(pointsPerRun) {
    const xs = [...new Set(pointsPerRun.flatMap(p => p.map(([x]) => x)).filter(x => x !== null))].sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const values = pointsPerRun.map(p => {
      const v = new Array(xs.length).fill(null);
      for (const [x, y] of p) if (x !== null) v[index.get(x)] = y === undefined ? null : y;
      return v;
    });
    return { xs, values };
  }

  /* Linear interpolation of sorted [x, y] points at x (null outside their range). */
  function interp(points, x) {
    if (!points.length || x < points[0][0] || x > points[points.length - 1][0]) return null;
    let i = 0;
    while (i < points.length - 1 && points[i + 1][0] < x) i++;
    const [x0, y0] = points[i];
    if (x0 === x || i === points.length - 1) return y0;
    const [x1, y1] = points[i + 1];
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
  }

  /* Runs grouped by metadata[key] (seeds of one setting): per group, on the union of its
   * runs' x values, the mean over the runs whose range covers x and ± 1 sd. */
  function groupBands(runs, pointsPerRun, key) {
    const groups = new Map();
    runs.forEach((r, i) => {
      const v = r.run.metadata && key in r.run.metadata ? JSON.stringify(r.run.metadata[key]) : "(none)";
      if (!groups.has(v)) groups.set(v, []);
      groups.get(v).push(i);
    });
    const out = [];
    for (const [value, members] of groups) {
      const pts = members.map(i => pointsPerRun[i].filter(p => p[0] !== null && p[1] !== null).sort((a, b) => a[0] - b[0]));
      const xs = [...new Set(pts.flat().map(p => p[0]))].sort((a, b) => a - b);
      const mean = [], lo = [], hi = [];
      for (const x of xs) {
        const ys = pts.map(p => interp(p, x)).filter(y => y !== null);
        const m = ys.reduce((a, b) => a + b, 0) / ys.length;
        const sd = ys.length > 1 ? Math.sqrt(ys.reduce((a, b) => a + (b - m) * (b - m), 0) / (ys.length - 1)) : 0;
        mean.push([x, m]); lo.push([x, m - sd]); hi.push([x, m + sd]);
      }
      out.push({ label: key + "=" + value.replace(/^"|"$/g, ""), members: members.map(i => runs[i].id), mean, lo, hi, colorIndex: members[0] });
    }
    return out;
  }

  /* The first point where the metric reaches the threshold, in rollouts and tokens (and its step). */
  function reach(r, metric, threshold, dir) {
    const pts = r.metrics.items.filter(m => metric in m.values).sort((a, b) => a.step - b.step);
    for (const m of pts) {
      const v = m.values[metric];
      if (dir === "ge" ? v >= threshold : v <= threshold) return { step: m.step, rollouts: r.ax.rollouts(m.step), tokens: r.ax.tokens(m.step), value: v };
    }
    return null;
  }

  function comparePage() {
    const ids = runIds();
    document.getElementById("compare-ids").textContent = ids.join(" · ");
    document.title = "Rollplan — compare " + ids.join(", ");
    view.file = "compare";
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
      let run;
      try {
        run = await api(base);
      } catch (e) {
        if (String(e.message || e).startsWith("404")) return { id, missing: String(e.message || e) };
        throw new Error(id + ": " + (e.message || e));
      }
      try {
        const [tl, dom, metrics] = await Promise.all([apiAll(base + "/timeline"), apiAll(base + "/domains"),
          apiAll(base + "/metrics?limit=10000")]);
        return { id, run, steps: tl.items, byStep: new Map(tl.items.map(s => [s.step, s])), dom, metrics,
          shares: domainShares(dom), ax: axes(tl.items, metrics), broken: await brokenRollouts(base) };
      } catch (e) {
        throw new Error(id + ": " + (e.message || e));
      }
    }

    /* Rollouts spent on the run's wrong-label suspects: the data-quality view's `broken`
     * findings (at its default confidence), summed; null where that view cannot be read. */
    async function brokenRollouts(base) {
      try {
        const dq = await apiAll(base + "/data-quality?kind=broken&limit=1000");
        return { prompts: dq.items.length, rollouts: dq.items.reduce((a, f) => a + f.rollouts, 0) };
      } catch (e) {
        return null;
      }
    }

    function headRow(runs, first) {
      return el("tr", {}, el("th", {}, first), ...runs.map(r => el("th", { "data-run": r.id }, swatch(r.index), r.id)));
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

    // -- controls ---------------------------------------------------------------------------
    const form = document.getElementById("compare-controls");
    const f = form.elements;
    f.x.value = ui.x; f.threshold.value = ui.threshold; f.dir.value = ui.dir; f.group.value = ui.group;
    const smooth = document.getElementById("smooth"), smoothOut = document.getElementById("smooth-value");
    smooth.value = String(view.smooth); smoothOut.textContent = view.smooth.toFixed(2);
    smooth.addEventListener("input", () => { smoothOut.textContent = Number(smooth.value).toFixed(2); setSmoothing(smooth.value); });
    function readControls() {
      Object.assign(ui, { x: f.x.value, metric: f.metric.value, threshold: f.threshold.value.trim(), dir: f.dir.value,
        baseline: f.baseline.value, group: f.group.value.trim() });
      setParams({ x: ui.x === "step" ? null : ui.x, metric: ui.metric || null, threshold: ui.threshold || null,
        dir: ui.dir === "ge" ? null : ui.dir, baseline: ui.baseline || null, group: ui.group || null });
      if (last) draw(last);
    }
    form.addEventListener("change", readControls);
    form.addEventListener("submit", (e) => { e.preventDefault(); readControls(); });

    function fillSelect(sel, values, labels, current) {
      const want = JSON.stringify(values);
      if (sel.dataset.values !== want) {
        sel.replaceChildren(...values.map((v, i) => el("option", { value: v }, labels ? labels[i] : v)));
        sel.dataset.values = want;
      }
      sel.value = values.includes(current) ? current : (values[0] ?? "");
      return sel.value;
    }

    // -- drawing ----------------------------------------------------------------------------
    let last = null;
    function draw(all) {
      const runs = all.filter(r => !r.missing);
      const missing = all.filter(r => r.missing);
      const note = document.getElementById("compare-missing");
      note.hidden = !missing.length;
      note.replaceChildren(...(missing.length ? [el("strong", {}, "Not found, left out: "),
        ...missing.flatMap((r, i) => [i ? ", " : "", el("code", { "data-missing": r.id }, r.id), " (" + r.missing + ")"])] : []));
      const xKey = ui.x, xLabel = XS[xKey], shared = xKey === "step";
      const xOf = (r, st) => r.ax[xKey](st);

      for (const [cid, value, opts] of CHARTS) {
        const { xs, values } = overlay(runs.map(r => r.steps.map(s => [xOf(r, s.step), value(s)])));
        lineChart(cid, xs, runs.map((r, k) => ({ label: r.id, color: color(r.index), values: values[k] })),
          { ...opts, xLabel, shared });
      }

      // eval metric: per run, or per group (mean ± 1 sd)
      const names = [...new Set(runs.flatMap(r => r.metrics.names))].sort();
      const metric = fillSelect(f.metric, names, null, ui.metric);
      const baseline = fillSelect(f.baseline, runs.map(r => r.id), null, ui.baseline);
      const keys = [...new Set(runs.flatMap(r => Object.keys(r.run.metadata || {})))].sort();
      document.getElementById("group-keys").replaceChildren(...keys.map(k => el("option", { value: k })));
      document.getElementById("eval-metric-name").textContent = metric ? metric + " vs " + xLabel : "(no eval metric in these runs)";
      const pointsPerRun = runs.map(r => r.metrics.items.filter(m => metric in m.values).map(m => [xOf(r, m.step), m.values[metric]]));
      if (ui.group) {
        const bands = groupBands(runs, pointsPerRun, ui.group);
        const { xs, values } = overlay(bands.flatMap(b => [b.mean, b.lo, b.hi]));
        lineChart("chart-eval", xs, bands.flatMap((b, k) => [
          { label: b.label + " mean (" + b.members.length + " runs)", color: color(b.colorIndex), values: values[3 * k], width: 2 },
          { label: b.label + " − 1 sd", color: color(b.colorIndex), values: values[3 * k + 1], dash: [4, 3], width: 1 },
          { label: b.label + " + 1 sd", color: color(b.colorIndex), values: values[3 * k + 2], dash: [4, 3], width: 1 },
        ]), { xLabel, shared, yLabel: metric, log: true });
        document.getElementById("chart-eval").setAttribute("data-groups", JSON.stringify(bands.map(b => ({ label: b.label, runs: b.members }))));
      } else {
        const { xs, values } = overlay(pointsPerRun);
        lineChart("chart-eval", xs, runs.map((r, k) => ({ label: r.id, color: color(r.index), values: values[k] })),
          { xLabel, shared, yLabel: metric, log: true });
        document.getElementById("chart-eval").removeAttribute("data-groups");
      }

      // rollouts to reach the threshold, and the ratio to the baseline
      const thr = ui.threshold === "" ? NaN : Number(ui.threshold);
      const reached = new Map(runs.map(r => [r.id, Number.isFinite(thr) && metric ? reach(r, metric, thr, ui.dir) : null]));
      const base = reached.get(baseline);
      const unit = xKey === "tokens" ? "tokens" : "rollouts";  // the ratio's unit
      document.getElementById("reach-what").textContent = Number.isFinite(thr) && metric
        ? "first eval where " + metric + (ui.dir === "ge" ? " ≥ " : " ≤ ") + thr + "; ratio: " + unit + " / " + baseline + "'s"
        : "type a threshold of the eval metric above";
      document.querySelector("#reach tbody").replaceChildren(...runs.map(r => {
        const got = reached.get(r.id);
        const ratio = got && base && base[unit] && got[unit] !== null ? got[unit] / base[unit] : null;
        return el("tr", { "data-run": r.id, "data-rollouts": got ? String(got.rollouts) : "", "data-step": got ? String(got.step) : "",
          "data-tokens": got && got.tokens !== null ? String(got.tokens) : "", "data-ratio": ratio === null ? "" : String(ratio) },
          el("td", {}, swatch(r.index), r.id + (r.id === baseline ? " (baseline)" : "")),
          el("td", {}, got ? fmt(got.rollouts) : (Number.isFinite(thr) ? "not reached" : "–")),
          el("td", {}, got && got.tokens !== null ? fmt(got.tokens) : "–"),
          el("td", {}, got ? String(got.step) : "–"),
          el("td", {}, got ? fmt(got.value) : "–"),
          el("td", {}, ratio === null ? "–" : ratio.toFixed(2) + "×"));
      }));

      // wasted rollouts (and tokens, where the reports carry them) per run
      document.querySelector("#waste tbody").replaceChildren(...runs.map(r => {
        const sum = (k) => r.steps.reduce((a, s) => a + (s[k] || 0), 0);
        const n = sum("rollouts"), w = sum("wasted_rollouts"), p = sum("wasted_all_solved"), fl = sum("wasted_all_failed");
        const share = (v) => (n ? pct(v / n) : "–");
        const hasTok = r.steps.some(s => s.tokens !== null && s.tokens !== undefined);
        const tk = hasTok ? sum("tokens") : null, wt = hasTok ? sum("wasted_tokens") : null;
        const br = r.broken ? r.broken.rollouts : null;
        return el("tr", { "data-run": r.id, "data-waste": JSON.stringify({ rollouts: n, wasted: w, all_pass: p, all_fail: fl,
          tokens: tk, wasted_tokens: wt, wrong_label: br, wrong_label_prompts: r.broken ? r.broken.prompts : null }) },
          el("td", {}, swatch(r.index), r.id), el("td", {}, fmt(n)), el("td", {}, fmt(w)), el("td", {}, share(w)),
          el("td", {}, fmt(p)), el("td", {}, share(p)), el("td", {}, fmt(fl)), el("td", {}, share(fl)),
          el("td", {}, fmt(w - p - fl)),
          el("td", { "data-cell": "wrong-label" }, br === null ? "–" : fmt(br)),
          el("td", { "data-cell": "wrong-label-share" }, br === null ? "–" : share(br)),
          el("td", {}, tk === null ? "–" : fmt(tk)), el("td", {}, wt === null ? "–" : fmt(wt)),
          el("td", {}, tk ? pct(wt / tk) : "–"));
      }));

      document.querySelector("#cards tbody").replaceChildren(...runs.map(r => {
        const st = r.run.stats, steps = r.steps.map(s => s.step);
        return el("tr", { "data-run": r.id },
          el("td", {}, swatch(r.index), el("a", { href: "/ui/runs/" + encodeURIComponent(r.id) }, r.id)),
          el("td", { title: JSON.stringify(r.run.strategy.params || {}) }, r.run.strategy.name),
          el("td", { "data-card": "prompts" }, fmt(st.prompts)),
          el("td", { "data-card": "steps" }, fmt(st.steps)),
          el("td", { "data-card": "range" }, steps.length ? steps[0] + "–" + steps[steps.length - 1] : "–"),
          el("td", { "data-card": "rollouts" }, fmt(st.rollouts)),
          el("td", { "data-card": "effective" }, st.rollouts ? pct(st.informative_rollouts / st.rollouts) : "–"),
          el("td", { "data-card": "reward" }, fmt(meanReward(r.steps))));
      }));

      const dkeys = [...new Set(runs.flatMap(r => [...r.dom.domains.map(domainKey), ...r.shares.overall.keys()]))]
        .sort((a, b) => (a === "") - (b === "") || (a < b ? -1 : a > b ? 1 : 0));
      sharesTable("domain-shares", runs, dkeys, r => r.shares.overall);
      sharesTable("domain-shares-last", runs, dkeys, r => r.shares.last);
      document.getElementById("domain-last-steps").textContent = runs.map(r => r.id + ": " + (r.shares.lastStep ?? "–")).join(" · ");
    }

    let drawn = null;
    async function refresh() {
      const all = (await Promise.all(ids.map(load))).map((r, i) => ({ ...r, index: i }));
      const text = JSON.stringify(all.map(r => r.missing ? [r.id, r.missing] : [r.run, r.steps, r.dom, r.metrics, r.broken]));
      if (text === drawn) return;  // nothing new: leave the page as it is
      drawn = text;
      last = all;
      draw(all);
    }
    schedule(refresh);
  }

  RP.register("compare", comparePage);
})();
