# ruff: noqa: F811  (the fixtures `live` and `browser` come from test_dashboard_browser)
"""The dashboard's interactive charts in a real headless Chromium (as in
``test_dashboard_browser.py``, whose fixtures and helpers these reuse): zoom that survives
refreshes and is shared across charts, charts that fit the window, state in the URL,
CSV/PNG downloads of each chart, smoothing and log toggles, the heatmap's tooltip and the
live / idle / finished status."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from urllib.parse import parse_qs, quote, unquote, urlparse

import httpx
import pytest
from sim import simulate
from test_dashboard_browser import (  # noqa: F401  (fixtures)
    SIM,
    api,
    assert_no_console_errors,
    attrs,
    browser,
    live,
    open_page,
    pytestmark,
    series,
)

LINE_CHARTS = ("chart-rollouts", "chart-reward", "chart-calibration", "chart-states", "chart-latency", "chart-domains",
               "chart-tokens")


def wait(driver, cond, timeout=60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(cond)


def loaded(driver) -> int:
    return int(driver.execute_script("return document.body.dataset.loaded || 0"))


def x_scales(driver) -> dict:
    return driver.execute_script(
        "const o = {}; for (const b of document.querySelectorAll('.chart')) if (b.uplot)"
        " o[b.id] = [b.uplot.scales.x.min, b.uplot.scales.x.max]; return o")


def drag_zoom(driver, chart_id, start=0.25, width=0.3):
    """Drag across a chart's plot area from `start` for `width` (fractions of its width)."""
    from selenium.webdriver.common.action_chains import ActionChains

    over = driver.find_element("css selector", f"#{chart_id} .u-over")
    w = over.size["width"]
    ActionChains(driver).move_to_element_with_offset(over, int(w * (start - 0.5)), 0).click_and_hold() \
        .move_by_offset(int(w * width), 0).release().perform()


def query(driver) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(driver.current_url).query, keep_blank_values=True).items()}


def near_half(server, run_id, n=50, **filters):
    """The run page's default order, from the API: predicted pass rate closest to 0.5 first
    (two sorted listings merged, as the page does)."""
    base = f"/v1/runs/{run_id}/prompts"
    lo, hi = filters.get("min_pass_rate", 0), filters.get("max_pass_rate", 1)
    up = api(server, base, **{**filters, "min_pass_rate": max(0.5, lo)}, sort="predicted_pass_rate", order="asc",
             limit=1000)["items"] if hi >= 0.5 else []
    down = api(server, base, **{**filters, "max_pass_rate": min(0.5, hi)}, sort="predicted_pass_rate", order="desc",
               limit=1000)["items"] if lo <= 0.5 else []
    out, seen, i, j = [], set(), 0, 0
    while len(out) < n and (i < len(up) or j < len(down)):
        if i < len(up) and (j >= len(down) or abs(up[i]["predicted_pass_rate"] - 0.5)
                            <= abs(down[j]["predicted_pass_rate"] - 0.5)):
            p, i = up[i], i + 1
        else:
            p, j = down[j], j + 1
        if p["id"] not in seen:
            seen.add(p["id"])
            out.append(p)
    return out


def report_step(client, run_id, step, rewards=(1, 0) * 4, report_id=None):
    plan = client.post(f"/v1/runs/{run_id}/plans", json={"batch_size": 8, "step": step}).json()
    r = client.post(f"/v1/runs/{run_id}/results", json={
        "report_id": report_id or f"r{step}", "step": step, "plan_id": plan["plan_id"],
        "results": [{"prompt_id": it["prompt_id"], "rewards": list(rewards)} for it in plan["items"]]})
    assert r.status_code == 200, r.text


def test_zoom_survives_refreshes_and_is_shared(live, browser):
    server, sim = live
    browser.set_window_size(1400, 1000)
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=1")
    full = x_scales(browser)
    assert set(full) == set(LINE_CHARTS) and full["chart-rollouts"] == [0, SIM["steps"] - 1]
    drag_zoom(browser, "chart-rollouts")
    wait(browser, lambda d: x_scales(d)["chart-rollouts"] != full["chart-rollouts"])
    zoom = x_scales(browser)["chart-rollouts"]
    assert 0 < zoom[0] < zoom[1] < SIM["steps"] - 1
    n = loaded(browser)
    wait(browser, lambda d: loaded(d) >= n + 2)  # two refreshes
    scales = x_scales(browser)
    for cid in LINE_CHARTS:  # kept, and shared by every chart of the page
        assert scales[cid] == pytest.approx(zoom), cid
    lo, hi = (float(v) for v in query(browser)["steps"].split(".."))
    assert (lo, hi) == pytest.approx(zoom, abs=0.01)
    drawn = json.loads(browser.find_element("id", "heatmap").get_attribute("data-drawn-steps"))
    assert drawn == [s for s in range(SIM["steps"]) if s + 0.5 >= zoom[0] and s - 0.5 <= zoom[1]]
    # the reward-log export follows the zoom
    href = browser.find_element("id", "export-csv").get_attribute("href")
    assert "format=csv" in href and f"step_from={math.ceil(zoom[0])}" in href and f"step_to={math.floor(zoom[1])}" in href

    # The URL restores the range; a double-click resets every chart.
    open_page(browser, browser.current_url)
    assert x_scales(browser)["chart-domains"] == pytest.approx([lo, hi])
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).double_click(browser.find_element("css selector", "#chart-reward .u-over")).perform()
    wait(browser, lambda d: all(v == [0, SIM["steps"] - 1] for v in x_scales(d).values()))
    assert "steps" not in query(browser)
    assert len(json.loads(browser.find_element("id", "heatmap").get_attribute("data-drawn-steps"))) == SIM["steps"]
    # The crosshair is linked: hovering one chart moves the cursor of the others to the same step.
    ActionChains(browser).move_to_element(browser.find_element("css selector", "#chart-rollouts .u-over")).perform()
    cursors = "return Array.from(document.querySelectorAll('.chart'), b => b.uplot.cursor.idx)"
    wait(browser, lambda d: (lambda i: len(i) == len(LINE_CHARTS) and i[0] is not None and len(set(i)) == 1)(
        d.execute_script(cursors)), 10)
    assert_no_console_errors(browser)


def test_zoom_is_kept_while_new_steps_arrive(live, browser):
    server, _ = live
    with httpx.Client(base_url=server.url, timeout=60) as c:
        simulate(c, run_id="zoom-run", n_prompts=60, steps=6, batch_size=8, seed=5)
        open_page(browser, server.url + "/ui/runs/zoom-run?refresh=1&steps=1..3.5")
        assert x_scales(browser)["chart-rollouts"] == [1, 3.5]
        report_step(c, "zoom-run", 6)
        wait(browser, lambda d: series(d, "chart-rollouts")["x"] == list(range(7)))
        n = loaded(browser)
        wait(browser, lambda d: loaded(d) >= n + 1)
    assert all(v == [1, 3.5] for v in x_scales(browser).values())
    assert_no_console_errors(browser)


def test_charts_fit_a_900px_window(live, browser):
    server, sim = live
    browser.set_window_size(1400, 1000)
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    browser.set_window_size(900, 1000)
    fits = """
      const out = [];
      for (const b of document.querySelectorAll('.chart, .heatmap')) {
        const s = b.closest('section'), r = s.getBoundingClientRect();
        const root = b.querySelector('.uplot, canvas'), rr = root.getBoundingClientRect();
        const leg = b.querySelector('.u-legend');
        const items = leg ? Array.from(leg.querySelectorAll('.u-series'), e => e.getBoundingClientRect()) : [];
        out.push({id: b.id, box: [b.scrollWidth, b.clientWidth], section: [s.scrollWidth, s.clientWidth],
          root: [rr.left, rr.right], inner: [r.left, r.right], legend: leg ? leg.offsetHeight : null,
          items: items.map(i => [i.left, i.right, i.width, i.height])});
      }
      return out;"""

    def all_fit(d):
        got = d.execute_script(fits)
        return got if all(g["box"][0] <= g["box"][1] and g["section"][0] <= g["section"][1]
                          and g["root"][1] <= g["inner"][1] + 0.5 for g in got) else False

    got = wait(browser, all_fit, 20)
    assert browser.execute_script("return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    for g in got:
        if g["id"] == "heatmap":
            continue
        assert g["legend"] and g["legend"] > 0, g
        assert g["items"] and all(w > 0 and h > 0 and left >= g["inner"][0] and right <= g["inner"][1] + 0.5
                                  for left, right, w, h in g["items"]), g
    # every series of the rollouts chart has its legend entry (label and marker) on screen
    labels = browser.execute_script(
        "return Array.from(document.querySelectorAll('#chart-rollouts .u-legend .u-series th'), e => e.innerText)")
    assert [s.rstrip(":").strip() for s in labels] == ["step", "rollouts", "informative", "wasted: all solved",
                                                      "wasted: all failed"]
    # y axes leave room for their widest tick label and their title (no overlap)
    roomy = browser.execute_script("""
      return Array.from(document.querySelectorAll('.chart'), b => {
        const u = b.uplot, a = u.axes[1]; u.ctx.font = a.font[0];
        const w = Math.max(0, ...(a._values || []).map(v => u.ctx.measureText(v).width)) / devicePixelRatio;
        return [b.id, a._size, w + a.gap + a.ticks.size];
      });""")
    for cid, size, need in roomy:
        assert size >= need, (cid, size, need)
    browser.set_window_size(1400, 1000)
    assert_no_console_errors(browser)


def test_large_numbers_on_the_y_axis_fit(live, browser):
    """A 500,000-scale axis gets a wide enough axis (uses RP.lineChart on a scratch box)."""
    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    assert browser.execute_script("return typeof RP.lineChart === 'function'")  # exported for compare.js too
    got = browser.execute_script("""
      const s = document.createElement('section'), b = document.createElement('div');
      b.id = 'scratch-chart'; b.className = 'chart'; s.append(b); document.querySelector('main').prepend(s);
      RP.lineChart('scratch-chart', [0, 1, 2], [{label: 'big', values: [0, 250000, 500000]}], {yLabel: 'rollouts'});
      return new Promise(res => requestAnimationFrame(() => requestAnimationFrame(() => {
        const u = b.uplot, a = u.axes[1]; u.ctx.font = a.font[0];
        const w = Math.max(...a._values.map(v => u.ctx.measureText(v).width)) / devicePixelRatio;
        res([a._values, a._size, w + a.gap + a.ticks.size]);
      })));""")
    values, size, need = got
    assert max(len(v) for v in values) >= len("500,000") and size >= need
    assert_no_console_errors(browser)


def test_filtered_prompts_view_is_restored_from_its_url(live, browser):
    from selenium.webdriver.support.ui import Select

    server, sim = live
    base = f"/v1/runs/{sim.run_id}/prompts"
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    # The default: frontier prompts, predicted pass rate closest to 0.5 first (not the near-solved ones).
    want = near_half(server, sim.run_id, state="frontier")
    wait(browser, lambda d: attrs(d, "#prompts tbody tr", "data-prompt") == [p["id"] for p in want])
    dist = [abs(p["predicted_pass_rate"] - 0.5) for p in want]
    assert dist == sorted(dist) and all(p["state"] == "frontier" for p in want)
    assert all(p["mean_reward"] < 1 for p in want[:10])
    browser.find_element("id", "more-prompts").click()  # the merged order pages on
    want = near_half(server, sim.run_id, n=100, state="frontier")
    assert len(want) == 100
    wait(browser, lambda d: attrs(d, "#prompts tbody tr", "data-prompt") == [p["id"] for p in want])

    form = browser.find_element("id", "prompt-filter")
    Select(form.find_element("name", "domain")).select_by_value("math")
    Select(form.find_element("name", "state")).select_by_value("")
    form.find_element("name", "min_pass_rate").send_keys("0.3")
    Select(form.find_element("name", "sort")).select_by_value("rollouts")
    Select(form.find_element("name", "order")).select_by_value("desc")
    form.find_element("css selector", "button[type=submit]").click()
    want = api(server, base, domain="math", min_pass_rate=0.3, sort="rollouts", order="desc", limit=50)["items"]
    assert want
    wait(browser, lambda d: attrs(d, "#prompts tbody tr", "data-prompt") == [p["id"] for p in want])
    q = query(browser)
    assert q == {"refresh": "0", "domain": "math", "state": "", "min_pass_rate": "0.3", "sort": "rollouts"}  # order desc: default

    url = browser.current_url
    browser.get("about:blank")
    open_page(browser, url)
    wait(browser, lambda d: attrs(d, "#prompts tbody tr", "data-prompt") == [p["id"] for p in want])
    form = browser.find_element("id", "prompt-filter")
    assert Select(form.find_element("name", "domain")).first_selected_option.get_attribute("value") == "math"
    assert Select(form.find_element("name", "state")).first_selected_option.get_attribute("value") == ""
    assert form.find_element("name", "min_pass_rate").get_attribute("value") == "0.3"
    assert Select(form.find_element("name", "sort")).first_selected_option.get_attribute("value") == "rollouts"

    # Nothing matches: a row says so.
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0&state=unsolved&min_pass_rate=0.95")
    assert api(server, base, state="unsolved", min_pass_rate=0.95)["items"] == []
    rows = wait(browser, lambda d: d.find_elements("css selector", "#prompts tbody tr.empty-row"))
    assert rows[0].text == "no prompts match" and not attrs(browser, "#prompts tbody tr[data-prompt]", "data-prompt")
    assert_no_console_errors(browser)


def csv_of(driver, chart_id):
    href = driver.find_element("css selector", f'.chart-tools[data-for="{chart_id}"] a.dl-csv').get_attribute("href")
    head, _, body = href.partition(",")
    assert head == "data:text/csv;charset=utf-8"
    return list(csv.reader(io.StringIO(unquote(body))))


def num(cell):
    return None if cell == "" else float(cell)


def test_chart_downloads_give_the_charts_data(live, browser):
    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    for cid in LINE_CHARTS:
        got, rows = series(browser, cid), csv_of(browser, cid)
        assert rows[0] == ["step", *got["series"]], cid
        assert [num(r[0]) for r in rows[1:]] == got["x"], cid
        for k, name in enumerate(got["series"], start=1):
            assert [num(r[k]) for r in rows[1:]] == got["series"][name], (cid, name)
    heat, rows = series(browser, "heatmap"), csv_of(browser, "heatmap")
    assert len(rows[0]) == 1 + 20 + 1 and rows[0][1] == "0.00-0.05" and rows[0][-1] == "unseen"
    assert [[int(c) for c in r[1:-1]] for r in rows[1:]] == heat["counts"]
    assert [int(r[0]) for r in rows[1:]] == heat["steps"]

    # PNG: made from the canvas when clicked (the download itself is cancelled here).
    browser.execute_script("document.addEventListener('click', e => { if (e.target.matches('a.dl-png')) e.preventDefault(); }, true)")
    for cid in ("chart-rollouts", "heatmap"):
        link = browser.find_element("css selector", f'.chart-tools[data-for="{cid}"] a.dl-png')
        link.click()
        href = link.get_attribute("href")
        assert href.startswith("data:image/png;base64,") and len(href) > 2000, cid
        assert link.get_attribute("download").endswith(".png")
    assert_no_console_errors(browser)


def ema(values, w):
    out, last, n = [], 0.0, 0
    for v in values:
        if v is None:
            out.append(None)
            continue
        last = last * w + (1 - w) * v
        n += 1
        out.append(last / (1 - w ** n))
    return out


def test_smoothing_and_log_scale_keep_the_raw_data(live, browser):
    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    raw = series(browser, "chart-rollouts")
    assert browser.find_element("id", "chart-rollouts").get_attribute("data-smoothed") is None
    browser.execute_script("const s = document.getElementById('smooth'); s.value = '0.6';"
                           "s.dispatchEvent(new Event('input', {bubbles: true}))")
    wait(browser, lambda d: d.find_element("id", "chart-rollouts").get_attribute("data-smoothed"))
    assert series(browser, "chart-rollouts") == raw  # data-series stays the API's values
    sm = json.loads(browser.find_element("id", "chart-rollouts").get_attribute("data-smoothed"))
    assert sm["weight"] == 0.6 and sm["x"] == raw["x"]
    for name, vals in raw["series"].items():
        assert sm["series"][name] == pytest.approx(ema(vals, 0.6)), name
    drawn = browser.execute_script("return document.getElementById('chart-rollouts').uplot.data[1]")
    assert drawn == pytest.approx(ema(raw["series"]["rollouts"], 0.6))
    calib = json.loads(browser.find_element("id", "chart-calibration").get_attribute("data-smoothed"))
    assert set(calib["series"]) == {"Brier", "mean predicted", "mean observed"}
    assert query(browser)["smooth"] == "0.6"

    box = '.chart-tools[data-for="chart-rollouts"] input[name=log]'
    browser.find_element("css selector", box).click()
    wait(browser, lambda d: d.execute_script("return document.getElementById('chart-rollouts').uplot.scales.y.distr") == 4)
    assert series(browser, "chart-rollouts") == raw
    assert query(browser)["log"] == "chart-rollouts"
    assert not browser.find_elements("css selector", '.chart-tools[data-for="chart-reward"] input[name=log]')
    assert browser.find_elements("css selector", '.chart-tools[data-for="chart-states"] input[name=log]')

    # Restored from the URL.
    open_page(browser, browser.current_url)
    assert browser.execute_script("return document.getElementById('chart-rollouts').uplot.scales.y.distr") == 4
    assert browser.find_element("id", "smooth").get_attribute("value") == "0.6"
    assert browser.find_element("id", "chart-states").get_attribute("data-smoothed")
    assert_no_console_errors(browser)


def test_heatmap_tooltip_colour_bar_and_unseen_toggle(live, browser):
    from selenium.webdriver.common.action_chains import ActionChains

    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    heat = series(browser, "heatmap")
    cv = browser.find_element("css selector", "#heatmap canvas")
    w, h = cv.size["width"], cv.size["height"]
    L, R, B, T, nb = 56, 86, 40, 8, 20
    pw, ph = (w - L - R) / len(heat["steps"]), (h - T - B) / nb

    def hover(i, j):
        x, y = L + (i + 0.5) * pw, h - B - (j + 0.5) * ph
        ActionChains(browser).move_to_element_with_offset(cv, int(x - w / 2), int(y - h / 2)).perform()
        tip = wait(browser, lambda d: d.find_element("css selector", "#heatmap .heat-tip[data-step]"), 10)
        wait(browser, lambda d: tip.get_attribute("data-step") == str(heat["steps"][i])
             and tip.get_attribute("data-bin") == str(j), 10)
        return tip

    i, j = 0, 10  # step 0, bin 0.50-0.55: where the never-seen prompts sit (Beta prior mean 0.5)
    tip = hover(i, j)
    total = sum(heat["counts"][i])
    assert int(tip.get_attribute("data-count")) == heat["counts"][i][j]
    assert float(tip.get_attribute("data-share")) == pytest.approx(heat["counts"][i][j] / total)
    assert "step 0" in tip.text and "0.50–0.55" in tip.text and f"of {total} prompts" in tip.text
    # the colour bar and axis titles are drawn: the bar's column has colour
    px = browser.execute_script(
        "const c = arguments[0], g = c.getContext('2d'), d = devicePixelRatio;"
        "return Array.from(g.getImageData((c.width / d - 86 + 20) * d, 30 * d, 1, 1).data)", cv)
    assert px[3] == 255 and px[:3] != [255, 255, 255]

    toggle = browser.find_element("css selector", '.chart-tools[data-for="heatmap"] input[name=no-unseen]')
    assert toggle.is_enabled(), browser.find_element("css selector", '.chart-tools[data-for="heatmap"] label').get_attribute("title")
    toggle.click()
    assert query(browser)["unseen"] == "0"
    unseen = heat["unseen"][i]
    assert unseen > 0
    seen = api(server, f"/v1/runs/{sim.run_id}/pass-rate-histogram", bins=20)["items"][i]["seen_counts"]
    assert heat["seen"][i] == seen and sum(seen) == total - unseen  # exact: the API bins the seen prompts
    tip = hover(i, j)
    assert int(tip.get_attribute("data-count")) == seen[j]
    assert float(tip.get_attribute("data-share")) == pytest.approx(seen[j] / (total - unseen))
    assert series(browser, "heatmap") == heat  # data-series unchanged
    assert_no_console_errors(browser)


def test_status_is_live_only_while_reports_arrive(live, browser):
    server, _ = live
    with httpx.Client(base_url=server.url, timeout=60) as c:
        simulate(c, run_id="status-run", n_prompts=40, steps=2, batch_size=8, seed=11)
        open_page(browser, server.url + "/ui/runs/status-run?refresh=1&stop=5")
        st = browser.find_element("id", "status")
        assert st.get_attribute("data-state") == "idle"  # no change seen yet
        assert "since this page opened" in st.text
        report_step(c, "status-run", 2)
        wait(browser, lambda d: st.get_attribute("data-state") == "live")
        assert series(browser, "chart-rollouts")["x"] == [0, 1, 2]
        assert "last new report seen" in st.text
        wait(browser, lambda d: st.get_attribute("data-state") == "idle", 30)
        assert "no new reports for" in st.text
        wait(browser, lambda d: st.get_attribute("data-state") == "finished", 30)
        assert "polling stopped" in st.text and st.get_attribute("data-polling") == "false"
        n = loaded(browser)
        time.sleep(2.5)
        assert loaded(browser) == n  # polling stopped
        report_step(c, "status-run", 3)
        browser.execute_script("window.dispatchEvent(new Event('focus'))")  # the page regains focus: resumes
        wait(browser, lambda d: series(d, "chart-rollouts")["x"] == [0, 1, 2, 3])
        wait(browser, lambda d: st.get_attribute("data-state") == "live")
        wait(browser, lambda d: st.get_attribute("data-state") == "finished", 30)
        report_step(c, "status-run", 4)
        browser.find_element("id", "refresh-now").click()  # so does the refresh button
        wait(browser, lambda d: series(d, "chart-rollouts")["x"] == [0, 1, 2, 3, 4])
        wait(browser, lambda d: st.get_attribute("data-polling") == "true")
        n = loaded(browser)
        wait(browser, lambda d: loaded(d) >= n + 1)
        assert st.get_attribute("data-state") == "live"
    assert_no_console_errors(browser)


def test_prompt_page_names_its_two_estimates(live, browser):
    server, sim = live
    top = api(server, f"/v1/runs/{sim.run_id}/prompts", state="frontier", sort="rollouts", order="desc", limit=1)["items"][0]
    trace = api(server, f"/v1/runs/{sim.run_id}/prompt-history/{quote(top['id'], safe='')}")
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}/prompts/{quote(top['id'], safe='')}?refresh=0")
    cards = {c.get_attribute("data-card"): c.text for c in browser.find_elements("css selector", ".card")}
    assert cards["predicted"].startswith("predicted pass rate (strategy)")
    assert f"{top['predicted_pass_rate']:.3f}" in cards["predicted"]
    a, b = trace["posterior"]["alpha"], trace["posterior"]["beta"]
    assert cards["posterior-mean"].startswith("Beta posterior mean") and f"{a / (a + b):.3f}" in cards["posterior-mean"]
    est = series(browser, "chart-estimate")
    assert est["series"]["Beta posterior mean"] == pytest.approx([h["predicted_pass_rate"] for h in trace["history"]])
    legend = browser.execute_script(
        "return Array.from(document.querySelectorAll('#chart-estimate .u-legend .u-series th'), e => e.innerText)")
    assert any("Beta posterior mean" in t for t in legend) and not any(t.startswith("predicted") for t in legend)
    heads = browser.execute_script("return Array.from(document.querySelectorAll('#history thead th'), e => e.innerText)")
    assert "Beta posterior mean after" in heads
    assert csv_of(browser, "chart-estimate")[0] == ["step", "Beta posterior mean", "− 2 sd", "+ 2 sd", "observed group mean"]
    assert_no_console_errors(browser)


def test_no_console_errors_on_any_page(live, browser):
    server, sim = live
    pid = quote(sim.prompts[0]["id"], safe="")
    for path in ("/ui/?refresh=0", f"/ui/runs/{sim.run_id}?refresh=0&steps=2..9&smooth=0.5&log=chart-states&unseen=0",
                 f"/ui/runs/{sim.run_id}/prompts/{pid}?refresh=0"):
        open_page(browser, server.url + path)
        assert_no_console_errors(browser)


def test_brier_has_its_own_y_scale(live, browser):
    """The calibration chart: pass rates on [0, 1] (left axis), the Brier score on its own
    right axis from 0 to a bit above its largest value, so small scores are not squashed."""
    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    brier = [b for b in series(browser, "chart-calibration")["series"]["Brier"] if b is not None]
    assert brier and max(brier) < 0.5, brier  # the simulated run's scores are all below 0.5
    got = wait(browser, lambda d: d.execute_script("""
      const u = document.getElementById('chart-calibration').uplot;
      if (!u || u.scales.brier.max === undefined || u.scales.brier.max === null) return null;
      return {scales: u.series.map(s => s.scale), brier: [u.scales.brier.min, u.scales.brier.max],
        y: [u.scales.y.min, u.scales.y.max], axes: u.axes.map(a => [a.scale, a.side, a.show !== false])};"""))
    assert got["scales"] == ["x", "brier", "y", "y"]  # x, Brier, mean predicted, mean observed
    assert got["y"] == [0, 1]
    lo, hi = got["brier"]
    assert lo == 0 and max(brier) <= hi <= 0.6 and hi == pytest.approx(1.15 * max(brier))
    assert hi < 0.6 < 1  # well below the pass rates' 1
    assert ["brier", 1, True] in got["axes"]  # its own axis, on the right
    assert_no_console_errors(browser)


SIG = "return Array.from(document.querySelectorAll(arguments[0] + ' .u-legend .u-series .u-value'), e => e.textContent)"


def significant_digits(text: str) -> int:
    digits = text.replace(",", "").replace("-", "").replace("−", "").replace(".", "").lstrip("0")
    if "." not in text:
        digits = digits.rstrip("0")  # an integer's trailing zeros are not significant
    return len(digits)


def set_cursor(driver, chart_id, idx):
    """Put a chart's cursor on data point idx (uPlot's setCursor) and read its legend values."""
    return driver.execute_script("""
      const u = document.getElementById(arguments[0]).uplot, x = u.data[0][arguments[1]];
      u.setCursor({left: u.valToPos(x, 'x'), top: u.bbox.height / devicePixelRatio / 2});
      return u.cursor.idx;""", chart_id, idx)


def test_legend_values_have_at_most_4_significant_digits(live, browser):
    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    fmt = browser.execute_script(
        "return [1234567, 0.123456, 12345.678, 2/3, 5, -0.000123456, null, undefined, NaN].map(v => RP.legendValue(null, v))")
    assert fmt == ["1,234,567", "0.1235", "12,350", "0.6667", "5", "-0.0001235", "–", "–", "–"]
    for cid in ("chart-reward", "chart-calibration", "chart-rollouts", "chart-states"):
        assert browser.execute_script(
            "return document.getElementById(arguments[0]).uplot.series.every(s => s.value === RP.legendValue)", cid), cid
        data = series(browser, cid)
        idx = len(data["x"]) // 2
        assert set_cursor(browser, cid, idx) == idx
        cells = browser.execute_script(SIG, "#" + cid)
        assert len(cells) == 1 + len(data["series"]), (cid, cells)
        assert cells[0] == f"{data['x'][idx]:,}"
        for cell, (name, values) in zip(cells[1:], data["series"].items()):
            v = values[idx]
            if v is None:
                assert cell == "–", (cid, name, cell)
                continue
            assert significant_digits(cell) <= 4, (cid, name, cell)
            assert float(cell.replace(",", "")) == pytest.approx(v, rel=5e-4, abs=1e-12), (cid, name, cell, v)
        if cid == "chart-reward":  # fractions: unrounded they would show more digits
            assert any(len(str(values[idx])) > 6 for values in data["series"].values() if values[idx] is not None)

    # the compare page's charts use the same formatter
    open_page(browser, server.url + f"/ui/compare?refresh=0&runs={sim.run_id}")
    assert browser.execute_script(
        "return Array.from(document.querySelectorAll('.chart'), b => b.uplot).filter(Boolean)"
        ".every(u => u.series.every(s => s.value === RP.legendValue))")
    data = series(browser, "chart-effective")
    idx = len(data["x"]) // 2
    assert set_cursor(browser, "chart-effective", idx) == idx
    cells = browser.execute_script(SIG, "#chart-effective")
    v = data["series"][sim.run_id][idx]
    assert cells[0] == f"{data['x'][idx]:,}" and significant_digits(cells[1]) <= 4
    assert float(cells[1]) == pytest.approx(v, rel=5e-4)
    assert_no_console_errors(browser)


TIPS = "return Array.from(document.querySelectorAll('.chart'), b => [b.id, !!b.querySelector('.chart-tip:not([hidden])')])"


def hover_chart(driver, chart_id, idx):
    """Move the mouse over a chart's plot area onto data point idx; the cursor's index."""
    from selenium.webdriver.common.action_chains import ActionChains

    over = driver.find_element("css selector", f"#{chart_id} .u-over")
    left = driver.execute_script(
        "const u = document.getElementById(arguments[0]).uplot; return u.valToPos(u.data[0][arguments[1]], 'x')",
        chart_id, idx)
    w = over.size["width"]
    left = min(max(left, 2), w - 2)  # the first and last points sit on the plot's edges: just inside
    ActionChains(driver).move_to_element_with_offset(over, int(round(left - w / 2)), 0).perform()
    get = "return document.getElementById(arguments[0]).uplot.cursor.idx"
    try:
        wait(driver, lambda d: d.execute_script(get, chart_id) == idx, 10)
    except Exception:  # noqa: BLE001  (the caller's assert shows where it went instead)
        pass
    return driver.execute_script(get, chart_id)


def check_tooltip(driver, chart_id, idx):
    """The chart's tooltip is shown, inside its box, with the x value and each shown series'
    value at idx (legend-formatted; none for a null value); no other chart shows its own."""
    tip = wait(driver, lambda d: d.find_element("css selector", f"#{chart_id} .chart-tip:not([hidden])"), 10)
    got = driver.execute_script("""
      const b = document.getElementById(arguments[0]), u = b.uplot, t = b.querySelector('.chart-tip');
      const i = u.cursor.idx, br = b.getBoundingClientRect(), tr = t.getBoundingClientRect();
      return {idx: i, dataIdx: t.dataset.idx, x: u.data[0][i], xLabel: u.series[0].label, text: t.innerText,
        rows: Array.from(t.querySelectorAll('[data-label]'), r => [r.dataset.label, r.textContent]),
        want: u.series.slice(1).map((s, k) => [s.label, s.show !== false, u.data[k + 1][i]]),
        inside: tr.left >= br.left - 0.5 && tr.right <= br.right + 0.5 && tr.top >= br.top - 0.5 && tr.bottom <= br.bottom + 0.5,
        fmt: u.series.slice(1).map((s, k) => RP.legendValue(u, u.data[k + 1][i]))};""", chart_id)
    assert got["idx"] == idx and got["dataIdx"] == str(idx), got
    assert tip.text.splitlines()[0] == f"{got['xLabel']} {got['x']:,}", got
    want = [(label, f"{label}: {f}") for (label, shown, v), f in zip(got["want"], got["fmt"]) if shown and v is not None]
    assert [tuple(r) for r in got["rows"]] == want, got
    assert got["inside"], got
    others = [cid for cid, shown in driver.execute_script(TIPS) if shown and cid != chart_id]
    assert not others, others
    return got


def test_line_charts_have_a_floating_tooltip(live, browser):
    server, sim = live
    browser.set_window_size(1400, 1000)
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    for cid in LINE_CHARTS:  # one tooltip element per chart, hidden until hovered
        assert browser.execute_script(
            "return document.querySelectorAll('#' + arguments[0] + ' .chart-tip[hidden]').length", cid) == 1, cid
    data = series(browser, "chart-reward")
    idx = len(data["x"]) // 2
    assert hover_chart(browser, "chart-reward", idx) == idx
    got = check_tooltip(browser, "chart-reward", idx)
    # not smoothed: the values shown are the chart's data at that step
    for label, text in got["rows"]:
        v = data["series"][label][idx]
        assert float(text.split(": ")[1].replace(",", "")) == pytest.approx(v, rel=5e-4, abs=1e-12), (label, text, v)
    assert any(data["series"][k][idx] is not None for k in data["series"]) and got["rows"]
    # the cursors of the other charts still follow (synced), without their tooltips
    cursors = browser.execute_script("return Array.from(document.querySelectorAll('.chart'), b => b.uplot.cursor.idx)")
    assert set(cursors) == {idx}, cursors
    # near the right edge the tooltip stays inside the chart's box
    last = len(data["x"]) - 1
    assert hover_chart(browser, "chart-reward", last) == last
    check_tooltip(browser, "chart-reward", last)
    # another chart: its tooltip, and the first one's hides
    assert hover_chart(browser, "chart-states", 1) == 1
    check_tooltip(browser, "chart-states", 1)
    # leaving the plot hides it
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(browser.find_element("css selector", "header")).perform()
    wait(browser, lambda d: not any(shown for _, shown in d.execute_script(TIPS)), 10)
    # a series hidden from the legend is left out
    browser.find_element("css selector", "#chart-reward .u-legend .u-series:nth-child(2)").click()
    assert hover_chart(browser, "chart-reward", idx) == idx
    got = check_tooltip(browser, "chart-reward", idx)
    assert got["want"][0][1] is False and got["want"][0][0] not in [r[0] for r in got["rows"]]
    assert_no_console_errors(browser)

    # the compare page's charts have it too
    open_page(browser, server.url + f"/ui/compare?refresh=0&runs={sim.run_id}")
    data = series(browser, "chart-effective")
    idx = len(data["x"]) // 2
    assert hover_chart(browser, "chart-effective", idx) == idx
    got = check_tooltip(browser, "chart-effective", idx)
    v = data["series"][sim.run_id][idx]
    assert got["rows"] and float(got["rows"][0][1].split(": ")[1].replace(",", "")) == pytest.approx(v, rel=5e-4)
    ActionChains(browser).move_to_element(browser.find_element("css selector", "header")).perform()
    wait(browser, lambda d: not any(shown for _, shown in d.execute_script(TIPS)), 10)
    assert_no_console_errors(browser)
