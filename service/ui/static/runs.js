/* Rollplan dashboard: the runs page. Every run (GET /v1/runs, all pages) in one table,
 * sortable (click a header) and searchable (run id / strategy); the sort and the search
 * live in the URL (?sort=&order=&q=), so a reload or a shared link keeps them. Tick 2–8
 * runs and press "compare" for /ui/compare?runs=a,b,c. Loaded after dashboard.js. */
"use strict";

(() => {
  const { apiAll, el, fmt, pct, schedule } = RP;
  const MIN = 2, MAX = 8;
  const ratio = (r) => r.stats.rollouts ? r.stats.informative_rollouts / r.stats.rollouts : null;
  // Sort key → [the run's value, the order of a first click].
  const COLUMNS = {
    run: [r => r.id, "asc"],
    strategy: [r => r.strategy.name, "asc"],
    prompts: [r => r.stats.prompts, "desc"],
    steps: [r => r.stats.steps, "desc"],
    rollouts: [r => r.stats.rollouts, "desc"],
    effective: [ratio, "desc"],
    last_report: [r => r.stats.last_report_at ? Date.parse(r.stats.last_report_at) : null, "desc"],
    created: [r => Date.parse(r.created_at), "desc"],
  };
  const ago = (iso) => {
    if (!iso) return "–";
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    return s < 90 ? Math.round(s) + " s ago" : s < 5400 ? Math.round(s / 60) + " min ago"
      : s < 129600 ? Math.round(s / 3600) + " h ago" : Math.round(s / 86400) + " d ago";
  };
  const DEFAULT = { sort: "created", order: "desc" };
  const cmp = (x, y) => (x < y ? -1 : x > y ? 1 : 0);  // code-point order: the same in every locale

  function readState() {
    const q = new URLSearchParams(location.search);
    const sort = Object.hasOwn(COLUMNS, q.get("sort")) ? q.get("sort") : DEFAULT.sort;
    const order = ["asc", "desc"].includes(q.get("order")) ? q.get("order")
      : (q.has("sort") ? COLUMNS[sort][1] : DEFAULT.order);
    return { sort, order, q: q.get("q") || "" };
  }

  function writeState(state) {
    const q = new URLSearchParams(location.search);
    for (const k of ["sort", "order", "q"]) q.delete(k);
    if (state.sort !== DEFAULT.sort || state.order !== DEFAULT.order) { q.set("sort", state.sort); q.set("order", state.order); }
    if (state.q) q.set("q", state.q);
    const s = q.toString();
    history.replaceState(null, "", location.pathname + (s ? "?" + s : ""));
  }

  function sorter(key, order) {
    const get = COLUMNS[key][0], sign = order === "desc" ? -1 : 1;
    return (a, b) => {
      const x = get(a), y = get(b);
      const nx = x === null || x === undefined || Number.isNaN(x), ny = y === null || y === undefined || Number.isNaN(y);
      if (nx || ny) return nx && ny ? cmp(a.id, b.id) : (nx ? 1 : -1);  // no value: last in either order
      return sign * cmp(x, y) || cmp(a.id, b.id);
    };
  }

  /* Every whitespace-separated term must occur (case-insensitively) in the id or the strategy. */
  function matcher(text) {
    const terms = text.toLowerCase().split(/\s+/).filter(Boolean);
    return (r) => terms.every(t => r.id.toLowerCase().includes(t) || r.strategy.name.toLowerCase().includes(t));
  }

  function runsPage() {
    const state = readState();
    // In the order ticked; ?select=a,b (a run page's "compare with…") starts with those ticked.
    const selected = new Set((new URLSearchParams(location.search).get("select") || "").split(",").filter(Boolean));
    const table = document.getElementById("runs");
    const tbody = table.querySelector("tbody");
    const search = document.getElementById("runs-search");
    const button = document.getElementById("compare");
    const note = document.getElementById("compare-note");
    const count = document.getElementById("runs-count");
    let runs = [], loaded = null;

    function updateCompare() {
      const n = selected.size;
      button.disabled = n < MIN || n > MAX;
      note.textContent = n === 0 ? "tick " + MIN + "–" + MAX + " runs to compare them"
        : n + " selected" + (n < MIN ? " — tick at least " + MIN : n > MAX ? " — at most " + MAX + " at once" : "");
    }

    function row(r) {
      const box = el("input", { type: "checkbox", checked: selected.has(r.id), title: "select to compare", "data-select": r.id });
      const tr = el("tr", { "data-run": r.id, class: selected.has(r.id) ? "selected" : "" },
        el("td", { class: "select" }, box),
        el("td", {}, el("a", { href: "/ui/runs/" + encodeURIComponent(r.id) }, r.id)),
        el("td", {}, r.strategy.name), el("td", {}, fmt(r.stats.prompts)), el("td", {}, fmt(r.stats.steps)),
        el("td", {}, fmt(r.stats.rollouts)), el("td", { "data-ratio": String(ratio(r)) }, pct(ratio(r))),
        el("td", { title: r.stats.last_report_at || "no report yet", "data-last-report": r.stats.last_report_at || "" }, ago(r.stats.last_report_at)),
        el("td", { title: r.created_at }, new Date(r.created_at).toLocaleString()));
      box.onchange = () => {
        if (box.checked) selected.add(r.id); else selected.delete(r.id);
        tr.classList.toggle("selected", box.checked);
        updateCompare();
      };
      return tr;
    }

    function render() {
      const shown = runs.filter(matcher(state.q)).sort(sorter(state.sort, state.order));
      tbody.replaceChildren(...shown.map(row));
      for (const b of table.querySelectorAll("thead button[data-sort]")) {
        const on = b.dataset.sort === state.sort;
        b.closest("th").setAttribute("aria-sort", on ? (state.order === "asc" ? "ascending" : "descending") : "none");
        b.dataset.arrow = on ? (state.order === "asc" ? "▲" : "▼") : "";
      }
      count.textContent = shown.length === runs.length ? runs.length + " runs" : shown.length + " of " + runs.length + " runs";
      const empty = document.getElementById("runs-empty");
      empty.hidden = shown.length > 0;
      empty.textContent = runs.length ? "No run matches the search." : "No runs yet.";
      updateCompare();
    }

    for (const b of table.querySelectorAll("thead button[data-sort]")) {
      b.onclick = () => {
        const key = b.dataset.sort;
        state.order = key === state.sort ? (state.order === "asc" ? "desc" : "asc") : COLUMNS[key][1];
        state.sort = key;
        writeState(state); render();
      };
    }
    search.value = state.q;
    search.oninput = () => { state.q = search.value; writeState(state); render(); };
    document.getElementById("runs-search-form").onsubmit = (e) => e.preventDefault();
    document.getElementById("clear-selection").onclick = () => { selected.clear(); render(); };
    button.onclick = () => {
      if (button.disabled) return;
      const refresh = new URLSearchParams(location.search).get("refresh");
      // Run ids are [A-Za-z0-9._:-]: a comma never occurs in one.
      location.href = "/ui/compare?runs=" + [...selected].map(encodeURIComponent).join(",")
        + (refresh !== null ? "&refresh=" + encodeURIComponent(refresh) : "");
    };
    updateCompare();

    schedule(async () => {
      const page = await apiAll("/v1/runs?limit=1000");
      const text = JSON.stringify(page.items);
      if (text === loaded) return;  // unchanged: keep the rows (and a click in flight) as they are
      loaded = text; runs = page.items;
      const known = new Set(runs.map(r => r.id));
      for (const id of selected) if (!known.has(id)) selected.delete(id);
      render();
    });
  }

  RP.register("runs", runsPage);
})();
