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

  /* A line chart's legend value (uPlot's series.value, x series too; run and compare pages):
   * integers (steps, counts) in full with thousands separators, other numbers to at most 4
   * significant digits, no value as "–". */
  function legendValue(u, v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "–";
    if (Number.isInteger(v)) return v.toLocaleString("en");
    return v.toLocaleString("en", { maximumSignificantDigits: 4 });
  }

  function status(msg, bad) {
    const s = document.getElementById("status");
    if (s) { s.textContent = msg; s.classList.toggle("bad", !!bad); }
  }

  function card(label, value, id) {
    return el("div", { class: "card", "data-card": id }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
  }

  /* A uPlot line chart; x: numbers, series: [{label, values, color?, dash?, points?, width?, smooth?}].
   * opts: height, y (y scale options), xLabel, yLabel, log (offer a "log y" toggle), smooth
   * (false: never smoothed), shared (false: x is not steps: the chart keeps out of the shared
   * x range, zoom and linked cursor).
   * One uPlot instance per container, kept across refreshes (setData): the user's x range
   * (zoom: drag across a chart, double-click to reset) is kept, shared by every chart of the
   * page (and the heatmap) and kept in the URL (?steps=a..b); the cursor is linked across
   * charts; the chart follows its container's width. data-series holds exactly the values
   * given; with EMA smoothing on (?smooth=, the run page's slider), the smoothed values drawn
   * are in data-smoothed and the raw ones are drawn faintly behind them. Each chart gets a
   * CSV (its data-series) and a PNG download link. */
  const SYNC_KEY = "rp-steps";
  const LOG_DEFAULT = [];
  const view = {
    range: parseRange(params.get("steps")),
    smooth: Math.min(0.99, Math.max(0, Number(params.get("smooth")) || 0)),
    log: new Set(params.has("log") ? params.get("log").split(",").filter(Boolean) : LOG_DEFAULT),
    noUnseen: params.get("unseen") === "0",
    file: "rollplan",
    listeners: [], // called with the new x range when it changes (heatmap, toolbar)
  };
  const chartArgs = {}, toolsOf = {}, heats = {};

  function parseRange(s) {
    const parts = (s || "").split("..").map(Number);
    return parts.length === 2 && parts.every(Number.isFinite) && parts[0] < parts[1] ? parts : null;
  }

  /* Merge `upd` ({key: value | null}) into the query string without adding a history entry. */
  function setParams(upd) {
    const q = new URLSearchParams(location.search);
    for (const [k, v] of Object.entries(upd)) { if (v === null || v === undefined) q.delete(k); else q.set(k, v); }
    const s = q.toString();
    history.replaceState(history.state, "", location.pathname + (s ? "?" + s : "") + location.hash);
  }

  /* Exponential moving average with TensorBoard's debiasing (weight w in [0, 1)); nulls stay. */
  function ema(values, w) {
    let last = 0, n = 0;
    return values.map(v => {
      if (v === null || v === undefined || !Number.isFinite(v)) return v === undefined ? null : v;
      last = last * w + (1 - w) * v; n++;
      return last / (1 - Math.pow(w, n));
    });
  }

  function sameRange(a, b) {
    if (!a || !b) return a === b;
    const eps = 1e-6 * Math.max(1, Math.abs(a[1] - a[0]));
    return Math.abs(a[0] - b[0]) <= eps && Math.abs(a[1] - b[1]) <= eps;
  }

  /* The page's shared x range: [min, max], or null for each chart's full data range. */
  function setRange(r, from) {
    if (sameRange(r, view.range)) return;
    view.range = r;
    setParams({ steps: r ? +r[0].toFixed(2) + ".." + +r[1].toFixed(2) : null });
    for (const [id, ch] of Object.entries(charts)) if (id !== from && ch.shared) applyRange(ch);
    for (const f of view.listeners) f(r);
  }

  function applyRange(ch) {
    const u = ch.plot;
    if (!u.data[0] || !u.data[0].length) return;
    if (view.range) u.setScale("x", { min: view.range[0], max: view.range[1] });
    else u.setData(u.data); // re-runs the auto range
  }

  /* setScale hook: a scale change that is not the shared range is the user's (drag zoom,
   * double-click reset); it becomes the shared range. */
  function onScale(id, u) {
    const ch = charts[id];
    if (!ch || ch.plot !== u || !ch.shared) return; // still being built, or not on steps
    const x = u.data[0], sc = u.scales.x;
    if (!x || !x.length || sc.min === null || sc.min === undefined) return;
    const r = [sc.min, sc.max];
    if (view.range && sameRange(r, view.range)) return;
    const full = sc.min <= x[0] + 1e-9 && sc.max >= x[x.length - 1] - 1e-9;
    setRange(full ? null : r, id);
  }

  /* y axis width from its widest tick label, so the axis title never overlaps the ticks. */
  function axisSize(u, values, i, cycle) {
    const a = u.axes[i];
    if (cycle > 1) return a._size;
    let w = 0;
    if (values && values.length) {
      u.ctx.font = a.font[0];
      for (const v of values) w = Math.max(w, u.ctx.measureText(String(v)).width);
    }
    return Math.ceil((a.ticks && a.ticks.show !== false ? a.ticks.size : 0) + a.gap + w / (window.devicePixelRatio || 1)) + 4;
  }

  /* The raw values behind smoothed lines, drawn faintly under the grid and series. */
  function drawRaw(id, u) {
    const ch = charts[id];
    if (!ch || ch.plot !== u || !ch.smoothed) return;
    const { left, top, width, height } = u.bbox, g = u.ctx, x = u.data[0];
    g.save();
    g.beginPath(); g.rect(left, top, width, height); g.clip();
    g.globalAlpha = 0.22; g.lineWidth = Math.max(1, window.devicePixelRatio || 1);
    ch.raw.forEach((vals, k) => {
      if (!ch.smoothable[k] || !u.series[k + 1].show) return;
      g.strokeStyle = ch.colors[k];
      g.beginPath();
      let pen = false;
      for (let i = 0; i < x.length; i++) {
        const v = vals[i];
        if (v === null || v === undefined || !Number.isFinite(v)) continue;
        const px = u.valToPos(x[i], "x", true), py = u.valToPos(v, u.series[k + 1].scale || "y", true);
        if (pen) g.lineTo(px, py); else { g.moveTo(px, py); pen = true; }
      }
      g.stroke();
    });
    g.restore();
  }

  function csvCell(v) {
    if (v === null || v === undefined) return "";
    const s = String(v);
    return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }
  function toCSV(rows) { return rows.map(r => r.map(csvCell).join(",")).join("\n") + "\n"; }
  const csvHref = (rows) => "data:text/csv;charset=utf-8," + encodeURIComponent(toCSV(rows));

  /* A PNG of a canvas on a white background (uPlot's canvas is transparent), with the
   * chart's title above and its legend (a swatch and the label of each series) below.
   * Returns the data URL and where each legend swatch was drawn (canvas pixels). */
  function pngOf(canvas, title, legend) {
    const dpr = window.devicePixelRatio || 1, W = canvas.width, pad = Math.round(8 * dpr);
    const titleH = title ? Math.round(24 * dpr) : 0, rowH = Math.round(18 * dpr), sw = Math.round(12 * dpr);
    const m = document.createElement("canvas").getContext("2d");
    m.font = Math.round(12 * dpr) + "px system-ui, sans-serif";
    // legend rows: swatch + label, wrapped to the width
    const items = [];
    let x = pad, row = 0;
    for (const it of legend || []) {
      const w = sw + Math.round(6 * dpr) + Math.ceil(m.measureText(it.label).width) + Math.round(14 * dpr);
      if (x + w > W - pad && x > pad) { row++; x = pad; }
      items.push({ ...it, x, row });
      x += w;
    }
    const legendH = items.length ? (row + 1) * rowH + pad : 0;
    const c = document.createElement("canvas");
    c.width = W; c.height = titleH + canvas.height + legendH;
    const g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    if (title) {
      g.fillStyle = "#1d1f24"; g.font = "600 " + Math.round(14 * dpr) + "px system-ui, sans-serif";
      g.textBaseline = "middle"; g.fillText(title, pad, titleH / 2);
    }
    g.drawImage(canvas, 0, titleH);
    g.font = Math.round(12 * dpr) + "px system-ui, sans-serif"; g.textBaseline = "middle";
    const boxes = items.map(it => {
      const y = titleH + canvas.height + Math.round(pad / 2) + it.row * rowH;
      g.fillStyle = it.color; g.fillRect(it.x, y + (rowH - sw) / 2, sw, sw);
      g.fillStyle = "#1d1f24"; g.fillText(it.label, it.x + sw + Math.round(6 * dpr), y + rowH / 2);
      return { label: it.label, color: it.color, x: it.x, y: Math.round(y + (rowH - sw) / 2), size: sw };
    });
    return { url: c.toDataURL("image/png"), legend: boxes, width: c.width, height: c.height };
  }

  /* The title of a chart: its opts.title, else its section's heading (without the note). */
  function chartTitle(id, box) {
    const args = chartArgs[id];
    if (args && args[2] && args[2].title) return args[2].title;
    const sec = box.closest("section"), h = sec ? sec.querySelector("h2, h3") : null;
    if (!h) return "";
    const own = [...h.childNodes].filter(n => n.nodeType === Node.TEXT_NODE).map(n => n.textContent).join("").trim();
    return (view.file ? view.file + " — " : "") + (own || h.textContent.trim());
  }

  const fileStem = (id) => view.file + "-" + id.replace(/^chart-/, "");

  /* The row of controls above a chart: optional toggles, CSV and PNG downloads. Made once. */
  function chartTools(id, box, toggles) {
    let t = toolsOf[id];
    if (t) return t;
    const bar = el("div", { class: "chart-tools", "data-for": id });
    t = toolsOf[id] = { bar, toggles: {} };
    for (const tg of toggles || []) {
      const cb = el("input", { type: "checkbox", name: tg.name, checked: tg.checked });
      cb.addEventListener("change", () => tg.change(cb.checked));
      const lab = el("label", { title: tg.title || "" }, cb, " " + tg.label);
      t.toggles[tg.name] = { cb, lab };
      bar.append(lab);
    }
    t.csv = el("a", { class: "dl-csv", download: fileStem(id) + ".csv", href: "#", title: "the chart's data as CSV" }, "CSV");
    t.png = el("a", { class: "dl-png", download: fileStem(id) + ".png", href: "#", title: "the chart as a PNG image" }, "PNG");
    t.png.addEventListener("click", () => {
      const ch = charts[id], c = ch ? ch.plot.ctx.canvas : box.querySelector("canvas");
      if (!c || !c.width) return;
      const args = chartArgs[id];
      const legend = ch && args ? args[1].map((s, i) => ({ label: s.label, color: ch.colors[i] }))
        .filter((_, i) => ch.plot.series[i + 1].show) : [];
      const out = pngOf(c, chartTitle(id, box), legend);
      t.png.href = out.url;
      t.png.setAttribute("data-legend", JSON.stringify(out.legend));
      t.png.setAttribute("data-size", JSON.stringify([out.width, out.height, c.width, c.height]));
    });
    bar.append(t.csv, t.png);
    box.before(bar);
    return t;
  }

  function rerender(id) { if (chartArgs[id]) lineChart(id, ...chartArgs[id]); }
  function rerenderAll() { for (const id of Object.keys(chartArgs)) rerender(id); }
  function setSmoothing(w) {
    view.smooth = Math.min(0.99, Math.max(0, Number(w) || 0));
    setParams({ smooth: view.smooth ? String(view.smooth) : null });
    rerenderAll();
  }

  /* A line chart's floating tooltip (a uPlot plugin; one element per chart, inside its
   * container box): while the mouse is over this chart's plot area it shows the x value and
   * each shown series' label and value at the cursor's index (legendValue; series without a
   * value there are left out), next to the cursor and kept inside the box. The cursors of the
   * other charts follow through the cursor sync but only the chart under the mouse shows it. */
  function tooltipPlugin(box, xLabel) {
    let tip = null, over = false;
    const hide = () => { if (tip) tip.hidden = true; };
    function show(u) {
      const { left, top, idx } = u.cursor;
      if (!over || idx === null || idx === undefined || left === undefined || left < 0 || top < 0) return hide();
      const rows = [el("div", { class: "chart-tip-x" }, xLabel + " " + legendValue(u, u.data[0][idx]))];
      for (let i = 1; i < u.series.length; i++) {
        const s = u.series[i], v = u.data[i] ? u.data[i][idx] : null;
        if (s.show === false || v === null || v === undefined) continue;
        const c = typeof s.stroke === "function" ? s.stroke(u, i) : s.stroke;
        rows.push(el("div", { "data-label": s.label },
          el("span", { class: "swatch", style: "background:" + c }), s.label + ": " + legendValue(u, v)));
      }
      tip.replaceChildren(...rows);
      tip.setAttribute("data-idx", String(idx));
      tip.setAttribute("data-x", String(u.data[0][idx]));
      tip.hidden = false;
      const ob = u.over.getBoundingClientRect(), bb = box.getBoundingClientRect();
      const mx = ob.left - bb.left - box.clientLeft + left, my = ob.top - bb.top - box.clientTop + top;
      const tw = tip.offsetWidth, th = tip.offsetHeight, W = box.clientWidth, H = box.clientHeight;
      let tx = mx + 14;
      if (tx + tw > W) tx = mx - 14 - tw; // no room on the right: on the cursor's left
      let ty = my + 14;
      if (ty + th > H) ty = my - 14 - th;
      tip.style.left = Math.max(0, Math.min(W - tw, tx)) + "px";
      tip.style.top = Math.max(0, Math.min(H - th, ty)) + "px";
    }
    return {
      hooks: {
        init: [(u) => {
          tip = el("div", { class: "chart-tip", hidden: true });
          box.append(tip);
          u.over.addEventListener("mouseenter", () => { over = true; });
          u.over.addEventListener("mouseleave", () => { over = false; hide(); });
        }],
        setCursor: [(u) => show(u)],
        destroy: [() => { if (tip) tip.remove(); tip = null; }],
      },
    };
  }

  function lineChart(id, x, series, opts = {}) {
    const box = document.getElementById(id);
    if (!box) return;
    chartArgs[id] = [x, series, opts];
    box.setAttribute("data-series", JSON.stringify({ x, series: Object.fromEntries(series.map(s => [s.label, s.values])) }));
    const w = opts.smooth === false ? 0 : view.smooth;
    const smoothable = series.map(s => w > 0 && s.smooth !== false && s.points !== "only");
    const drawn = series.map((s, i) => smoothable[i] ? ema(s.values, w) : s.values);
    if (smoothable.some(Boolean)) {
      const sm = {};
      series.forEach((s, i) => { if (smoothable[i]) sm[s.label] = drawn[i]; });
      box.setAttribute("data-smoothed", JSON.stringify({ x, weight: w, series: sm }));
    } else box.removeAttribute("data-smoothed");

    const logY = !!opts.log && view.log.has(id);
    const t = chartTools(id, box, opts.log ? [{
      name: "log", label: "log y", checked: logY,
      title: "symmetric log scale (asinh): log-like for large counts, linear near 0 so zero counts stay visible",
      change: (on) => {
        if (on) view.log.add(id); else view.log.delete(id);
        setParams({ log: view.log.size ? [...view.log].join(",") : null });
        rerender(id);
      },
    }] : []);
    const xLabel = opts.xLabel || "step";
    t.csv.href = csvHref([[xLabel, ...series.map(s => s.label)], ...x.map((v, i) => [v, ...series.map(s => s.values[i])])]);

    const data = [x, ...drawn];
    const shared = opts.shared !== false;
    const shape = series.map(s => s.label).join("|") + (logY ? "|log" : "") + "|" + xLabel;
    const colors = series.map((s, i) => s.color || COLORS[i % COLORS.length]);
    let ch = charts[id];
    if (ch && ch.shape === shape && x.length) {
      Object.assign(ch, { raw: series.map(s => s.values), smoothable, smoothed: smoothable.some(Boolean), colors });
      ch.plot.setData(data);
      if (view.range && shared) ch.plot.setScale("x", { min: view.range[0], max: view.range[1] });
      return;
    }
    if (ch) { ch.ro.disconnect(); ch.plot.destroy(); delete charts[id]; delete box.uplot; }
    box.textContent = "";
    if (!x.length) { box.append(el("div", { class: "empty" }, "no data yet")); return; }
    const height = opts.height || 220;
    // log y: asinh (log-like, but 0 stays drawable), from 0 for counts; grid lines at powers of 10.
    const yScale = logY ? { distr: 4, asinh: 1, range: (u, mn, mx) => {
      const r = uPlot.rangeAsinh(mn, mx, 10, true);
      return [mn >= 0 ? 0 : r[0], Math.max(r[1], 1)];
    } } : (opts.y || {});
    const pow10 = (v) => v === 0 || Math.abs(Math.abs(v) - 10 ** Math.round(Math.log10(Math.abs(v)))) < 1e-9 * Math.abs(v);
    ch = { shape, height, width: Math.max(200, Math.floor(box.clientWidth)), raw: series.map(s => s.values), smoothable,
      smoothed: smoothable.some(Boolean), colors, shared };
    ch.plot = new uPlot({
      width: ch.width,
      height,
      // opts.y2: a second y scale on the right, { scale, label, range }, for the series with s.scale.
      scales: { x: { time: false }, y: yScale, ...(opts.y2 ? { [opts.y2.scale]: { range: opts.y2.range } } : {}) },
      cursor: shared ? { sync: { key: SYNC_KEY, setSeries: false }, drag: { x: true, y: false } } : { drag: { x: false, y: false } },
      // Steps and group numbers are integers: ticks only at whole numbers.
      axes: [{ label: xLabel, labelSize: 18, labelGap: 0, size: 34, gap: 4,
        incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 1e5, 1e6] },
      { label: opts.yLabel || "", labelSize: opts.yLabel ? 18 : 0, labelGap: 0, gap: 5, size: axisSize,
        // (uPlot's asinh splits start below the scale's 0: leave those out)
        ...(logY ? { filter: (u, splits) => splits.map(v => v >= u.scales.y.min && pow10(v) ? v : null),
          ticks: { filter: (u, splits) => splits.map(v => v >= u.scales.y.min ? v : null) },
          grid: { filter: (u, splits) => splits.map(v => v >= u.scales.y.min && pow10(v) ? v : null) } } : {}) },
      ...(opts.y2 ? [{ scale: opts.y2.scale, side: 1, label: opts.y2.label || "", labelSize: opts.y2.label ? 18 : 0, labelGap: 0,
        gap: 5, size: axisSize, grid: { show: false } }] : [])],
      series: [{ label: xLabel, value: legendValue }, ...series.map((s, i) => ({
        label: s.label,
        scale: s.scale || "y",
        value: legendValue,
        stroke: colors[i],
        width: s.width || 1.5,
        dash: s.dash,
        points: { show: s.points !== undefined ? !!s.points : x.length < 60 },
        paths: s.points === "only" ? () => null : undefined,
        spanGaps: true,
      }))],
      plugins: [tooltipPlugin(box, xLabel)],
      hooks: {
        setScale: [(u, key) => { if (key === "x") onScale(id, u); }],
        drawClear: [(u) => drawRaw(id, u)],
      },
    }, data, box);
    charts[id] = ch;
    box.uplot = ch.plot; // for tests and the console
    if (view.range && shared) ch.plot.setScale("x", { min: view.range[0], max: view.range[1] });
    ch.ro = new ResizeObserver(() => {
      const wNow = Math.max(200, Math.floor(box.clientWidth));
      if (wNow === ch.width) return;
      ch.width = wNow;
      requestAnimationFrame(() => { if (charts[id] === ch) ch.plot.setSize({ width: ch.width, height }); });
    });
    ch.ro.observe(box);
  }

  /* The Brier axis: from 0 to 15% above the largest drawn score (at most 1; 0.25 with none). */
  function brierRange(u, mn, mx) {
    if (mx === null || mx === undefined || !Number.isFinite(mx) || mx <= 0) return [0, 0.25];
    return [0, Math.min(1, mx * 1.15)];
  }

  /* Viridis-like colour ramp for the heatmap. */
  const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function ramp(t) {
    t = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
    const i = Math.min(RAMP.length - 2, Math.floor(t)), f = t - i;
    const c = RAMP[i].map((v, k) => Math.round(v + f * (RAMP[i + 1][k] - v)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  /* The pool's predicted pass rates per step: colour = share of the step's prompts in the bin
   * (square-root scale, colour bar on the right), hover for the values. Follows the shared x
   * range. extra: {unseen: never-seen prompts per step, seen: the histogram of the prompts
   * seen by then, per step (the API's seen_counts), used to leave the never-seen out}. */
  function heatmap(id, steps, counts, edges, extra = {}) {
    const box = document.getElementById(id);
    box.setAttribute("data-series", JSON.stringify({ steps, counts, edges, unseen: extra.unseen || null, seen: extra.seen || null }));
    let h = heats[id];
    if (!h) {
      h = heats[id] = { width: 0 };
      h.tools = chartTools(id, box, [{
        name: "no-unseen", label: "leave out never-seen prompts", checked: view.noUnseen,
        change: (on) => { view.noUnseen = on; setParams({ unseen: on ? "0" : null }); drawHeat(id); },
      }]);
      h.tip = el("div", { class: "heat-tip", hidden: true });
      box.append(h.tip);
      const cv = box.querySelector("canvas");
      cv.addEventListener("mousemove", (ev) => {
        const r = cv.getBoundingClientRect();
        h.mouse = { x: ev.clientX - r.left, y: ev.clientY - r.top };
        hoverHeat(id);
      });
      cv.addEventListener("mouseleave", () => { h.mouse = null; h.tip.hidden = true; });
      cv.addEventListener("dblclick", () => setRange(null));
      view.listeners.push(() => drawHeat(id));
      h.ro = new ResizeObserver(() => {
        const wNow = Math.max(200, Math.floor(box.clientWidth));
        if (wNow !== h.width) requestAnimationFrame(() => drawHeat(id));
      });
      h.ro.observe(box);
    }
    h.args = { steps, counts, edges, unseen: extra.unseen || null, seen: extra.seen || null };
    const tg = h.tools.toggles["no-unseen"];
    tg.cb.disabled = !h.args.seen;
    tg.lab.classList.toggle("disabled", tg.cb.disabled);
    tg.lab.title = h.args.seen ? "show only the prompts with at least one reported group by each step" : "no per-step histogram of seen prompts";
    const nb = edges.length - 1, binName = (j) => edges[j].toFixed(2) + "-" + edges[j + 1].toFixed(2);
    h.tools.csv.href = csvHref([["step", ...Array.from({ length: nb }, (_, j) => binName(j)), "unseen"],
      ...steps.map((s, i) => [s, ...counts[i], h.args.unseen ? h.args.unseen[i] : null])]);
    drawHeat(id);
  }

  function drawHeat(id) {
    const h = heats[id], box = document.getElementById(id);
    if (!h || !h.args || !box) return;
    const { steps, counts, edges, seen } = h.args;
    const cv = box.querySelector("canvas");
    const W = Math.max(200, Math.floor(box.clientWidth)), H = 280, L = 56, B = 40, T = 8, R = 86;
    h.width = W;
    const dpr = window.devicePixelRatio || 1;
    cv.width = W * dpr; cv.height = H * dpr; cv.style.width = W + "px"; cv.style.height = H + "px";
    const g = cv.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, W, H);
    g.font = "11px system-ui, sans-serif"; g.fillStyle = "#555";
    h.layout = null; h.tip.hidden = true;
    let idx = steps.map((_, i) => i);
    if (view.range) idx = idx.filter(i => steps[i] + 0.5 >= view.range[0] && steps[i] - 0.5 <= view.range[1]);
    box.setAttribute("data-drawn-steps", "[]");
    if (!idx.length) { g.fillText(steps.length ? "no step in the zoomed range" : "no data yet", L, H / 2); return; }
    const excl = view.noUnseen && !!seen;
    const nb = edges.length - 1, pw = (W - L - R) / idx.length, ph = (H - T - B) / nb;
    const cols = idx.map(i => {
      const c = (excl ? seen[i] : counts[i]).slice();
      const total = c.reduce((a, b) => a + b, 0);
      return { step: steps[i], c, total };
    });
    cols.forEach((col, k) => col.c.forEach((v, j) => {
      g.fillStyle = ramp(col.total ? Math.sqrt(v / col.total) : 0);
      g.fillRect(L + k * pw, H - B - (j + 1) * ph, Math.ceil(pw), Math.ceil(ph));
    }));
    g.fillStyle = "#333";
    // y: bin edges and the title
    g.textAlign = "right"; g.textBaseline = "middle";
    for (let j = 0; j <= nb; j += Math.max(1, Math.round(nb / 5))) g.fillText(edges[j].toFixed(1), L - 5, H - B - j * ph);
    g.save(); g.translate(12, T + (H - B - T) / 2); g.rotate(-Math.PI / 2); g.textAlign = "center";
    g.fillText("predicted pass rate", 0, 0); g.restore();
    // x: steps and the title
    g.textAlign = "center"; g.textBaseline = "top";
    const every = Math.max(1, Math.ceil(cols.length / Math.max(2, Math.floor((W - L - R) / 44))));
    cols.forEach((col, k) => { if (k % every === 0) g.fillText(String(col.step), L + (k + 0.5) * pw, H - B + 4); });
    g.fillText(excl ? "step (never-seen prompts left out)" : "step", L + (W - L - R) / 2, H - B + 22);
    // colour bar: share of the step's prompts, square-root scale
    const x0 = W - R + 14, bw = 12, top = T, bot = H - B;
    for (let y = top; y < bot; y++) { g.fillStyle = ramp(1 - (y - top) / (bot - top)); g.fillRect(x0, y, bw, 1); }
    g.strokeStyle = "#999"; g.strokeRect(x0 + 0.5, top + 0.5, bw - 1, bot - top - 1);
    g.fillStyle = "#333"; g.textAlign = "left"; g.textBaseline = "middle";
    for (const s of [0, 0.01, 0.05, 0.1, 0.25, 0.5, 1]) {
      const y = bot - Math.sqrt(s) * (bot - top);
      g.fillRect(x0 + bw, Math.round(y), 3, 1);
      g.fillText((100 * s) + "%", x0 + bw + 5, Math.min(bot - 5, Math.max(top + 5, y)));
    }
    g.save(); g.translate(W - 9, top + (bot - top) / 2); g.rotate(-Math.PI / 2); g.textAlign = "center";
    g.fillText(excl ? "share of seen prompts" : "share of prompts", 0, 0); g.restore();
    h.layout = { L, B, H, W, pw, ph, nb, cols, excl };
    box.setAttribute("data-drawn-steps", JSON.stringify(cols.map(c => c.step)));
    if (h.mouse) hoverHeat(id); // keep the tooltip through a refresh
  }

  function hoverHeat(id) {
    const h = heats[id], lay = h && h.layout;
    if (!lay || !h.mouse) return;
    const mx = h.mouse.x, my = h.mouse.y;
    const k = Math.floor((mx - lay.L) / lay.pw), j = Math.floor((lay.H - lay.B - my) / lay.ph);
    if (k < 0 || k >= lay.cols.length || j < 0 || j >= lay.nb) { h.tip.hidden = true; return; }
    const col = lay.cols[k], e = h.args.edges, n = col.c[j];
    const share = col.total ? n / col.total : 0;
    h.tip.replaceChildren(
      el("div", {}, "step " + col.step),
      el("div", {}, "predicted pass rate " + e[j].toFixed(2) + "–" + e[j + 1].toFixed(2)),
      el("div", {}, fmt(n) + " of " + fmt(col.total) + (lay.excl ? " seen" : "") + " prompts (" + pct(share) + ")"));
    Object.assign(h.tip.dataset, { step: String(col.step), bin: String(j), count: String(n), share: String(share) });
    h.tip.hidden = false;
    const tw = h.tip.offsetWidth, th = h.tip.offsetHeight;
    h.tip.style.left = Math.max(0, Math.min(lay.W - tw, mx + 14)) + "px";
    h.tip.style.top = Math.max(0, Math.min(lay.H - th, my + 14)) + "px";
  }

  function fillTable(id, rows) {
    const tb = document.querySelector("#" + id + " tbody");
    tb.replaceChildren(...rows);
  }

  /* Polls fn every REFRESH seconds (?refresh=N, 0: once). fn may return a signature of the
   * run's state (e.g. its stats); then the status says "live" while it changed within the
   * last LIVE_WINDOW refreshes, "idle" after that, and "finished" once it has not changed for
   * STOP_AFTER refreshes (?stop=N), when polling stops; it resumes when the page regains
   * focus or on the refresh button. "live" and "idle" are judged by the changes this page
   * saw; the server's time of the latest report (a run's stats.last_report_at) is shown too. */
  const LIVE_WINDOW = 3;
  const STOP_AFTER = params.has("stop") ? Math.max(1, Number(params.get("stop")) || 12) : 12;
  function schedule(fn) {
    const st = document.getElementById("status");
    const opened = Date.now();
    let timer = null, busy = false, again = false, sig, lastChange = null, lastOk = null, unchanged = 0, stopped = false, error = null;
    let latest = null;  // what fn returned last (a run's stats carry last_report_at)
    const ago = (t) => {
      const s = Math.max(0, Math.round((Date.now() - t) / 1000));
      return s < 120 ? s + " s" : s < 7200 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h";
    };
    function show() {
      if (!st) return;
      if (error) { status(error, true); st.dataset.state = "error"; return; }
      if (lastOk === null) return;
      let state, text;
      if (REFRESH <= 0) { state = "static"; text = "loaded " + new Date(lastOk).toLocaleTimeString() + " · auto-refresh off"; }
      else if (sig === undefined) { state = "polling"; text = "live · refreshed " + new Date(lastOk).toLocaleTimeString(); }
      else if (lastChange !== null && Date.now() - lastChange <= LIVE_WINDOW * REFRESH * 1000) {
        state = "live"; text = "live · last new report seen " + ago(lastChange) + " ago";
      } else {
        state = stopped ? "finished" : "idle";
        text = state + " · " + (lastChange !== null ? "no new reports for " + ago(lastChange)
          : "no new reports in the " + ago(opened) + " since this page opened") + (stopped ? " · polling stopped" : "");
      }
      // The server's time of the run's latest report, when the page's data carries it.
      if (latest && latest.last_report_at) text += " · last report committed " + ago(Date.parse(latest.last_report_at)) + " ago";
      else if (latest && "last_report_at" in latest) text += " · no report yet";
      status(text, false);
      st.dataset.state = state;
      st.title = "Times are of changes this page saw in the run's stats (checked every " + REFRESH + " s); "
        + "polling stops after " + STOP_AFTER + " checks without a change and resumes on focus or refresh.";
    }
    async function tick() {
      clearTimeout(timer); timer = null;
      if (busy) { again = true; return; }
      busy = true;
      try {
        const s = await fn();
        error = null; lastOk = Date.now();
        latest = s && typeof s === "object" ? s : null;
        if (s !== undefined) {
          const k = typeof s === "string" ? s : JSON.stringify(s);
          if (sig !== undefined) { if (k !== sig) { lastChange = Date.now(); unchanged = 0; } else unchanged++; }
          sig = k;
        }
      } catch (e) { error = String(e.message || e); }
      busy = false;
      document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
      stopped = REFRESH > 0 && sig !== undefined && unchanged >= STOP_AFTER;
      if (st) st.dataset.polling = String(REFRESH > 0 && !stopped);
      show();
      if (again) { again = false; tick(); return; }
      if (REFRESH > 0 && !stopped) timer = setTimeout(tick, REFRESH * 1000);
    }
    function resume() { if (stopped) { stopped = false; unchanged = 0; } tick(); }
    window.addEventListener("focus", () => { if (stopped) resume(); });
    document.addEventListener("visibilitychange", () => { if (!document.hidden && stopped) resume(); });
    const btn = document.getElementById("refresh-now");
    if (btn) btn.addEventListener("click", resume);
    if (REFRESH > 0) setInterval(show, 1000);
    tick();
  }

  // -- run page -----------------------------------------------------------------------
  function runIdFromPath() { return decodeURIComponent(location.pathname.split("/")[3]); }

  /* The prompts table's filters; in the URL (names as in the API) where they differ from these. */
  const PROMPT_DEFAULTS = { domain: "", state: "frontier", min_pass_rate: "", max_pass_rate: "", sort: "near_half", order: "desc" };
  const PROMPT_KEYS = Object.keys(PROMPT_DEFAULTS);

  /* One sorted listing of /prompts, read page by page as rows are taken. */
  function promptStream(base, q) {
    let buf = [], cursor = null, done = false;
    return {
      async peek() {
        while (!buf.length && !done) {
          const qq = new URLSearchParams(q);
          if (cursor) qq.set("cursor", cursor);
          const page = await api(base + "/prompts?" + qq);
          buf = page.items; cursor = page.next_cursor; done = !cursor;
        }
        return buf[0];
      },
      shift() { return buf.shift(); },
      get more() { return buf.length > 0 || !done; },
    };
  }

  /* Rows for the filters. sort "near_half": predicted pass rate closest to 0.5 first — the API
   * sorts by one key, so two listings (p ≥ 0.5 ascending, p ≤ 0.5 descending) are merged. */
  function promptSource(base, f) {
    const q = new URLSearchParams({ limit: "50" });
    for (const k of ["domain", "state", "min_pass_rate", "max_pass_rate"]) if (f[k] !== "") q.set(k, f[k]);
    if (f.sort !== "near_half") {
      q.set("sort", f.sort); q.set("order", f.order || "asc");
      const s = promptStream(base, q);
      return {
        async take(n) { const out = []; while (out.length < n && await s.peek()) out.push(s.shift()); return out; },
        get more() { return s.more; },
      };
    }
    const lo = f.min_pass_rate === "" ? 0 : Number(f.min_pass_rate), hi = f.max_pass_rate === "" ? 1 : Number(f.max_pass_rate);
    const up = new URLSearchParams(q), down = new URLSearchParams(q);
    up.set("min_pass_rate", String(Math.max(0.5, lo))); up.set("sort", "predicted_pass_rate"); up.set("order", "asc");
    down.set("max_pass_rate", String(Math.min(0.5, hi))); down.set("sort", "predicted_pass_rate"); down.set("order", "desc");
    const a = hi >= 0.5 ? promptStream(base, up) : null, b = lo <= 0.5 ? promptStream(base, down) : null;
    const taken = new Set();
    return {
      async take(n) {
        const out = [];
        while (out.length < n) {
          const pa = a ? await a.peek() : undefined, pb = b ? await b.peek() : undefined;
          if (!pa && !pb) break;
          const useA = pa && (!pb || Math.abs(pa.predicted_pass_rate - 0.5) <= Math.abs(pb.predicted_pass_rate - 0.5));
          const p = useA ? a.shift() : b.shift();
          if (!taken.has(p.id)) { taken.add(p.id); out.push(p); }
        }
        return out;
      },
      get more() { return !!((a && a.more) || (b && b.more)); },
    };
  }

  async function runPage() {
    const runId = runIdFromPath();
    const base = "/v1/runs/" + encodeURIComponent(runId);
    document.getElementById("run-id").textContent = runId;
    document.getElementById("compare-with").href = "/ui/?select=" + encodeURIComponent(runId);
    document.title = "Rollplan — " + runId;
    view.file = runId.replace(/[^\w.-]+/g, "_");
    let domainsKnown = "";

    // -- toolbar: smoothing, zoom, reward-log export ------------------------------------------
    const smooth = document.getElementById("smooth"), smoothOut = document.getElementById("smooth-value");
    smooth.value = String(view.smooth); smoothOut.textContent = view.smooth.toFixed(2);
    smooth.addEventListener("input", () => { smoothOut.textContent = Number(smooth.value).toFixed(2); setSmoothing(smooth.value); });
    const resetZoom = document.getElementById("reset-zoom");
    resetZoom.addEventListener("click", () => setRange(null));
    function showRange() {
      const r = view.range;
      resetZoom.hidden = !r;
      document.getElementById("zoom-note").textContent = r
        ? "steps " + fmt(r[0], 1) + "–" + fmt(r[1], 1) + " (zoomed; double-click a chart to reset)"
        : "drag across a chart to zoom into steps";
      for (const f of ["ndjson", "csv"]) {
        const q = new URLSearchParams({ format: f });
        if (r) { q.set("step_from", String(Math.max(0, Math.ceil(r[0])))); q.set("step_to", String(Math.max(0, Math.floor(r[1])))); }
        const a = document.getElementById("export-" + f);
        a.href = base + "/export?" + q;
        a.title = "the run's reward log as " + f.toUpperCase() + (r ? ", zoomed steps only" : "");
      }
      document.getElementById("export-range").textContent = r ? "(steps " + Math.max(0, Math.ceil(r[0])) + "–" + Math.max(0, Math.floor(r[1])) + ")" : "(all steps)";
    }
    view.listeners.push(showRange);
    showRange();

    // -- prompts table: filters in the URL ----------------------------------------------------
    const pform = document.getElementById("prompt-filter");
    const more = document.getElementById("more-prompts");
    let source = null, promptsComplete = false;
    function syncOrder() { pform.elements.order.disabled = pform.elements.sort.value === "near_half"; }
    function readForm() {
      const f = {};
      for (const k of PROMPT_KEYS) f[k] = pform.elements[k] ? pform.elements[k].value : PROMPT_DEFAULTS[k];
      return f;
    }
    let filters = { ...PROMPT_DEFAULTS };
    for (const k of PROMPT_KEYS) if (params.has(k)) filters[k] = params.get(k);
    for (const k of PROMPT_KEYS) {
      const inp = pform.elements[k];
      if (!inp || k === "domain") continue; // the domain's options come with the first refresh
      inp.value = filters[k];
      if (inp.value !== filters[k]) inp.value = filters[k] = PROMPT_DEFAULTS[k]; // not an option: default
    }
    syncOrder();
    pform.elements.sort.addEventListener("change", syncOrder);

    async function loadPrompts(append) {
      if (!append || !source) source = promptSource(base, filters);
      const items = await source.take(50);
      const rows = items.map(p => el("tr", { "data-prompt": p.id },
        el("td", {}, el("a", { href: "/ui/runs/" + encodeURIComponent(runId) + "/prompts/" + encodeURIComponent(p.id) }, p.id)),
        el("td", {}, p.domain ?? "–"), el("td", {}, el("span", { class: "state " + p.state }, p.state)),
        el("td", {}, fmt(p.predicted_pass_rate)), el("td", {}, fmt(p.rollouts)), el("td", {}, fmt(p.mean_reward)),
        el("td", {}, p.last_step ?? "–")));
      const tb = document.querySelector("#prompts tbody");
      if (append) tb.append(...rows);
      else tb.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty-row" }, el("td", { colSpan: 7 }, "no prompts match"))]));
      promptsComplete = !source.more;
      more.hidden = promptsComplete;
    }
    pform.onsubmit = (ev) => {
      ev.preventDefault();
      filters = readForm();
      const upd = {};
      for (const k of PROMPT_KEYS) upd[k] = filters[k] === PROMPT_DEFAULTS[k] ? null : filters[k];
      setParams(upd);
      loadPrompts(false).catch(e => status(e.message, true));
    };
    more.onclick = () => loadPrompts(true).catch(e => status(e.message, true));

    async function refresh() {
      const [run, tl, hist, dom, cov, evals] = await Promise.all([
        api(base), apiAll(base + "/timeline"), apiAll(base + "/pass-rate-histogram?bins=20"), apiAll(base + "/domains"),
        api(base + "/coverage"), apiAll(base + "/metrics?limit=10000"),
      ]);
      showEvals(evals);
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
        // Completion tokens (runs whose reports carry them): all, and those in zero-variance groups.
        ...(t.some(s => s.tokens !== null && s.tokens !== undefined) ? [
          card("tokens", fmt(sum("tokens")), "tokens"),
          card("wasted tokens", fmt(sum("wasted_tokens")) + (sum("tokens") ? " (" + pct(sum("wasted_tokens") / sum("tokens")) + ")" : ""),
            "wasted-tokens")] : []),
        card("frontier prompts", fmt(hist.current.states.frontier), "frontier"),
        card("mean Brier", briers.length ? fmt(briers.reduce((a, b) => a + b, 0) / briers.length) : "–", "brier"),
        card("plan compute", ms.length ? fmt(ms.reduce((a, b) => a + b, 0) / ms.length, 2) + " ms" : "–", "compute"));

      lineChart("chart-rollouts", steps, [
        { label: "rollouts", values: t.map(s => s.rollouts) },
        { label: "informative", values: t.map(s => s.informative_rollouts), color: "#3ca951" },
        { label: "wasted: all solved", values: t.map(s => s.wasted_all_solved), color: "#efb118" },
        { label: "wasted: all failed", values: t.map(s => s.wasted_all_failed), color: "#ff725c" },
      ], { yLabel: "rollouts", log: true });
      lineChart("chart-reward", steps, [
        { label: "mean reward", values: t.map(s => s.mean_reward) },
        { label: "effective ratio", values: t.map(s => s.effective_ratio), color: "#3ca951" },
      ], { y: { range: [0, 1] } });
      // Pass rates on [0, 1] (left axis); the Brier score (mostly 0.02–0.2) on its own right
      // axis from 0 to a bit above its largest value, so its line is not squashed.
      lineChart("chart-calibration", steps, [
        { label: "Brier", values: t.map(s => s.calibration ? s.calibration.brier : null), color: "#a463f2", scale: "brier" },
        { label: "mean predicted", values: t.map(s => s.calibration ? s.calibration.mean_predicted : null), color: "#97bbf5", dash: [4, 3] },
        { label: "mean observed", values: t.map(s => s.calibration ? s.calibration.mean_observed : null), color: "#9c6b4e", dash: [4, 3] },
      ], { y: { range: [0, 1] }, yLabel: "pass rate", y2: { scale: "brier", label: "Brier", range: brierRange } });
      lineChart("chart-latency", steps, [
        { label: "compute ms", values: t.map(s => s.plan ? s.plan.compute_ms : null), color: "#ff8ab7" },
      ], { yLabel: "ms" });
      // Tokens per step (empty for runs whose reports carry none).
      lineChart("chart-tokens", steps, [
        { label: "tokens", values: t.map(s => s.tokens) },
        { label: "wasted (no signal)", values: t.map(s => s.wasted_tokens), color: "#ff725c" },
        { label: "truncated completions", values: t.map(s => s.truncated), color: "#efb118", dash: [4, 3] },
      ], { yLabel: "tokens", log: true });

      const h = hist.items;
      heatmap("heatmap", h.map(s => s.step), h.map(s => s.counts), hist.edges,
        { unseen: h.map(s => s.states.unseen), seen: h.map(s => s.seen_counts) });
      const states = ["unseen", "unsolved", "frontier", "solved"];
      const stateColors = { unseen: "#9498a0", unsolved: "#ff725c", frontier: "#3ca951", solved: "#4269d0" };
      lineChart("chart-states", h.map(s => s.step), states.map(k => ({ label: k, values: h.map(s => s.states[k]), color: stateColors[k] })),
        { yLabel: "prompts", log: true });

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
      showCoverage(cov, hist.current.strategy_state.memorisation);
      const known = JSON.stringify(names);
      if (known !== domainsKnown) {
        domainsKnown = known;
        const sel = pform.elements.domain;
        sel.replaceChildren(el("option", { value: "" }, "any"), ...names.filter(n => n !== null).map(n => el("option", { value: n }, n)));
        sel.value = filters.domain;
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
      // The table is re-read while it shows every match (not after "more" was used).
      if (!source || promptsComplete) await loadPrompts(false);
      await refreshQuality(names, run.stats);
      return run.stats;
    }

    /* The run's eval metrics (GET .../metrics): one line per metric over the steps it was
     * measured at (null where a step lacks it). */
    function showEvals(m) {
      const x = m.items.map(i => i.step);
      lineChart("chart-evals", x, m.names.map(n => ({ label: n, values: m.items.map(i => n in i.values ? i.values[n] : null) })),
        { yLabel: "value", log: true });
      document.getElementById("evals-note").textContent = m.names.length
        ? m.names.length + " metric" + (m.names.length > 1 ? "s" : "") + " at " + x.length + " step" + (x.length > 1 ? "s" : "")
          + " · compare runs by rollouts on the compare page"
        : "No eval metrics yet: the TRL, verl and OpenRLHF plugins send the trainer's evaluations; any client can POST them to /v1/runs/{run_id}/metrics.";
    }

    /* The coverage panel: re-use of the rollouts (headline numbers), per domain, and each
     * domain's share of the reported groups per tenth of the steps so far (x: the window;
     * empty windows are gaps). */
    function showCoverage(c, memo) {
      const signed = (x) => (x === null || x === undefined) ? "–" : (x >= 0 ? "+" : "") + fmt(x, 3);
      const cards = [
        card("rollouts on the top 10% of prompts", pct(c.top10_share), "cov-top10"),
        card("median rollouts per seen prompt", fmt(c.median_per_seen, 1), "cov-median"),
        card("max rollouts per seen prompt", fmt(c.max_per_seen, 1), "cov-max"),
        card("pool seen", pct(c.seen_share) + " (" + fmt(c.seen) + " of " + fmt(c.prompts) + ")", "cov-seen")];
      // The strategy's estimate of memorisation (default): re-used prompts' excess pass rate over
      // the model's prediction beyond first-time groups'.
      if (memo) cards.push(card("memorisation of re-used prompts", signed(memo.estimate) + " (re-used "
        + signed(memo.reused_excess) + ", first-time " + signed(memo.first_time_excess) + ")", "cov-memo"));
      document.getElementById("coverage-cards").replaceChildren(...cards);
      fillTable("coverage-domains", c.domains.map(d => el("tr", { "data-domain": d.domain ?? "" },
        el("td", {}, d.domain ?? "(none)"), el("td", {}, fmt(d.prompts)), el("td", {}, pct(d.seen_share)),
        el("td", {}, fmt(d.rollouts)), el("td", {}, pct(d.rollout_share)), el("td", {}, pct(d.unvisited_share)))));
      const w = c.windows;
      const withSteps = w.filter(x => x.step_from !== null);
      document.getElementById("coverage-note").textContent = withSteps.length
        ? "window 1 = steps " + withSteps[0].step_from + "–" + withSteps[0].step_to + ", window " + w.length + " = steps "
          + withSteps[withSteps.length - 1].step_from + "–" + withSteps[withSteps.length - 1].step_to
          + " (" + fmt(w.reduce((a, x) => a + x.groups, 0)) + " groups)"
        : "no reported groups yet";
      lineChart("chart-coverage", w.map((_, i) => i + 1), c.domains.map((d, k) => ({
        label: d.domain === null ? "(none)" : d.domain,
        values: c.picks_by_window.map((row, i) => w[i].groups ? row[k] : null),
      })), { y: { range: [0, 1] }, xLabel: "window", yLabel: "share of groups", smooth: false, shared: false });
    }

    // -- data quality: filters and sort in the URL (dq_*), re-read when the run changes -------
    const QUALITY_DEFAULTS = { kind: "", domain: "", min_confidence: "0.5", min_rollouts: "1", sort: "confidence", order: "desc" };
    const QUALITY_KEYS = Object.keys(QUALITY_DEFAULTS);
    const QUALITY_TEXT = { broken: "wrong label", too_hard: "too hard for now", solved: "always solved", noisy: "noisy", learned: "learned" };
    const qform = document.getElementById("quality-filter");
    const qtable = document.getElementById("quality");
    let quality = { ...QUALITY_DEFAULTS };
    for (const k of QUALITY_KEYS) if (params.has("dq_" + k)) quality[k] = params.get("dq_" + k);
    for (const k of ["kind", "min_confidence", "min_rollouts"]) {
      const inp = qform.elements[k];
      inp.value = quality[k];
      if (inp.value !== quality[k]) inp.value = quality[k] = QUALITY_DEFAULTS[k]; // not an option: default
    }
    let qualitySig = null, qualityDomains = null;
    function fillQualityDomains(names) {
      const known = JSON.stringify(names);
      if (known === qualityDomains) return;
      qualityDomains = known;
      const sel = qform.elements.domain;
      sel.replaceChildren(el("option", { value: "" }, "any"), ...names.filter(n => n !== null).map(n => el("option", { value: n }, n)));
      sel.value = quality.domain;
      if (sel.value !== quality.domain) sel.value = quality.domain = "";
    }
    function writeQuality() {
      const upd = {};
      for (const k of QUALITY_KEYS) upd["dq_" + k] = quality[k] === QUALITY_DEFAULTS[k] ? null : quality[k];
      setParams(upd);
    }
    function showQualitySort() {
      for (const b of qtable.querySelectorAll("thead button[data-sort]")) {
        const on = b.dataset.sort === quality.sort;
        b.closest("th").setAttribute("aria-sort", on ? (quality.order === "asc" ? "ascending" : "descending") : "none");
        b.dataset.arrow = on ? (quality.order === "asc" ? "▲" : "▼") : "";
      }
    }
    async function loadQuality() {
      const base = "/v1/runs/" + encodeURIComponent(runId) + "/data-quality";
      const q = new URLSearchParams();
      for (const k of QUALITY_KEYS) if (quality[k] !== "") q.set(k, quality[k]);
      for (const f of ["csv", "jsonl"]) {
        const d = new URLSearchParams(q); d.set("format", f);
        document.getElementById("quality-" + f).href = base + "?" + d;
      }
      q.set("limit", "1000");
      const page = await apiAll(base + "?" + q);
      const c = page.counts;
      document.getElementById("quality-counts").textContent =
        "At this confidence: " + c.broken + " wrong labels, " + c.too_hard + " too hard for now, " + c.solved + " always solved, "
        + c.noisy + " noisy, " + c.learned + " learned (confidence: " + (page.model === "log" ? "each group against its domain's pass rate at its step" : page.model === "strategy" ? "the strategy's own stuck/solved model" : "a Beta test per domain") + ").";
      fillTable("quality", page.items.map(i => el("tr", { "data-prompt": i.prompt_id, "data-kind": i.kind },
        el("td", {}, el("a", { href: "/ui/runs/" + encodeURIComponent(runId) + "/prompts/" + encodeURIComponent(i.prompt_id) }, i.prompt_id)),
        el("td", {}, i.domain ?? "(none)"), el("td", {}, QUALITY_TEXT[i.kind] || i.kind), el("td", {}, fmt(i.confidence)),
        el("td", {}, fmt(i.groups)), el("td", {}, fmt(i.rollouts)), el("td", {}, fmt(i.passes, 1)),
        el("td", {}, fmt(i.all_pass_groups)), el("td", {}, fmt(i.all_fail_groups)), el("td", {}, fmt(i.last_group_mean, 2)),
        el("td", {}, i.last_step ?? "–"), el("td", {}, fmt(i.predicted_pass_rate)))));
      document.getElementById("quality-empty").hidden = page.items.length > 0;
      showQualitySort();
    }
    /* Re-read with each refresh that found the run changed (it reads the whole pool). */
    async function refreshQuality(names, stats) {
      fillQualityDomains(names);
      const sig = JSON.stringify([stats.rollouts, stats.steps, stats.prompts]);
      if (sig === qualitySig) return;
      qualitySig = sig;
      await loadQuality();
    }
    qform.addEventListener("submit", (e) => {
      e.preventDefault();
      for (const k of ["kind", "domain", "min_confidence", "min_rollouts"]) quality[k] = qform.elements[k].value;
      writeQuality();
      loadQuality().catch(err => status(err.message, true));
    });
    for (const b of qtable.querySelectorAll("thead button[data-sort]")) {
      b.onclick = () => {
        const key = b.dataset.sort;
        const text = ["prompt_id", "domain", "kind"].includes(key);
        quality.order = key === quality.sort ? (quality.order === "asc" ? "desc" : "asc") : (text ? "asc" : "desc");
        quality.sort = key;
        writeQuality();
        loadQuality().catch(err => status(err.message, true));
      };
    }
    schedule(refresh);
  }

  // -- prompt page --------------------------------------------------------------------
  async function promptPage() {
    const parts = location.pathname.split("/");
    const runId = decodeURIComponent(parts[3]);
    const promptId = decodeURIComponent(parts.slice(5).join("/"));
    const runBase = "/v1/runs/" + encodeURIComponent(runId);
    const link = document.getElementById("run-link");
    link.textContent = runId; link.href = "/ui/runs/" + encodeURIComponent(runId);
    document.getElementById("prompt-id").textContent = promptId;
    document.title = "Rollplan — " + promptId;
    view.file = (runId + "-" + promptId).replace(/[^\w.-]+/g, "_");

    async function refresh() {
      const [run, p] = await Promise.all([api(runBase), api(runBase + "/prompt-history/" + encodeURIComponent(promptId))]);
      const a = p.posterior.alpha, b = p.posterior.beta;
      // Two different numbers: the strategy's prediction (what plans use, and the prompt's
      // state) and the per-prompt Beta posterior mean (the chart and the history table).
      document.getElementById("cards").replaceChildren(
        card("domain", p.domain ?? "–", "domain"), card("state", p.state, "state"),
        card("predicted pass rate (strategy)", fmt(p.predicted_pass_rate), "predicted"),
        card("Beta posterior mean", fmt(a / (a + b)), "posterior-mean"),
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
        { label: "Beta posterior mean", values: hs.map(e => e.predicted_pass_rate), width: 2 },
        { label: "− 2 sd", values: hs.map((e, i) => Math.max(0, e.predicted_pass_rate - 2 * sd[i])), color: "#97bbf5", dash: [4, 3] },
        { label: "+ 2 sd", values: hs.map((e, i) => Math.min(1, e.predicted_pass_rate + 2 * sd[i])), color: "#97bbf5", dash: [4, 3] },
        { label: "observed group mean", values: hs.map(e => e.mean_reward), color: "#ff725c", points: "only" },
      ], { y: { range: [0, 1] }, xLabel: byStep ? "step" : "reported group #", smooth: false });
      fillTable("history", hs.map((e, i) => el("tr", { "data-step": e.step },
        el("td", {}, i + 1), el("td", {}, e.step), el("td", {}, e.report_id),
        el("td", { class: "rewards" }, e.rewards.map(r => fmt(r, 2)).join(" ")), el("td", {}, fmt(e.mean_reward)),
        el("td", {}, e.informative ? "yes" : "no"), el("td", {}, fmt(e.predicted_pass_rate)))));
      fillTable("planned", p.planned.map(e => el("tr", {}, el("td", {}, e.step), el("td", {}, e.rollouts), el("td", {}, fmt(e.predicted_pass_rate)))));
      return run.stats;
    }
    schedule(refresh);
  }

  /* Pages by body[data-page]; other scripts (runs.js, compare.js) add theirs with
   * RP.register(name, fn), loaded after this file and before DOMContentLoaded. */
  const pages = { run: runPage, prompt: promptPage };
  function register(name, fn) { pages[name] = fn; }
  document.addEventListener("DOMContentLoaded", () => {
    const page = pages[document.body.dataset.page];
    if (page) page(); else status("no script registered page " + JSON.stringify(document.body.dataset.page), true);
  });
  return { api, apiAll, el, fmt, pct, legendValue, status, lineChart, schedule, register, COLORS, setSmoothing, setParams, view, fillTable };
})();
