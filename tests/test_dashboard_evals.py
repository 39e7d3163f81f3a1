"""Eval metrics and the compare-by-rollouts view in a real headless Chromium against a real
``rollplan serve`` (see test_dashboard_browser.py for what it needs and the skip /
ROLLPLAN_REQUIRE_BROWSER logic, reused here).

Four simulated runs, two settings (``beta`` and ``uniform``) of two seeds each, with eval
metrics posted through ``POST /v1/runs/{run_id}/metrics``: the run page draws them; the
compare page draws them against the step, the cumulative rollouts and the wall time,
tells the rollouts each run took to reach a threshold (and the ratio to a baseline run),
totals the wasted rollouts, groups seeds into mean ± 1 sd, names a missing run and
exports PNGs with their title and legend.
"""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import pytest
from conftest import ServerProcess
from sim import simulate
from test_dashboard_browser import (  # noqa: F401  (the module's Chromium fixture and marks)
    api,
    assert_no_console_errors,
    attrs,
    browser,
    open_page,
    pytestmark,
    series,
)

RUNS = {  # run id -> (strategy, seed, setting, eval/accuracy at steps 1, 3, 5)
    "beta-s1": ("beta", 1, "beta", [0.2, 0.5, 0.8]),
    "beta-s2": ("beta", 2, "beta", [0.3, 0.6, 0.7]),
    "unif-s1": ("uniform", 3, "uniform", [0.1, 0.3, 0.5]),
    "unif-s2": ("uniform", 4, "uniform", [0.1, 0.2, 0.6]),
}
EVAL_STEPS = [1, 3, 5]
WITH_TOKENS = {"beta-s1", "beta-s2", "unif-s1"}  # their reports carry completion tokens; unif-s2's do not


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("ui-evals")
    srv = ServerProcess(f"sqlite:///{d / 'ui.db'}", d).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            for rid, (strategy, seed, setting, acc) in RUNS.items():
                # different batch sizes: the runs' cumulative rollouts differ at equal steps
                batch = 8 if strategy == "beta" else 6
                simulate(c, run_id=rid, strategy=strategy, n_prompts=40, steps=6, batch_size=batch, rollouts=8,
                         seed=seed, tokens=rid in WITH_TOKENS)
                r = c.put(f"/v1/runs/{rid}", json={"strategy": {"name": strategy}, "rollouts_per_prompt": 8,
                                                   "metadata": {"setting": setting, "seed": seed}})
                assert r.status_code == 200, r.text
                body = {"metrics": [{"step": st, "values": {"eval/accuracy": a, "eval_loss": 2.0 - a}}
                                    for st, a in zip(EVAL_STEPS, acc)]}
                r = c.post(f"/v1/runs/{rid}/metrics", json=body)
                assert r.status_code == 200 and r.json()["created"] == 6, r.text
        yield srv
    finally:
        srv.stop()


def cumulative_tokens(server, rid):
    """step -> completion tokens reported up to and including it."""
    cum, n = {}, 0
    for t in api(server, f"/v1/runs/{rid}/timeline")["items"]:
        n += t["tokens"] or 0
        cum[t["step"]] = n
    return cum


def cumulative(server, rid):
    """step -> rollouts reported up to and including it; step -> seconds since the first step."""
    tl = api(server, f"/v1/runs/{rid}/timeline")["items"]
    cum, n = {}, 0
    for t in tl:
        n += t["rollouts"]
        cum[t["step"]] = n
    t0 = min(datetime.fromisoformat(t["time"]) for t in tl)
    secs = {t["step"]: round((datetime.fromisoformat(t["time"]) - t0).total_seconds(), 2) for t in tl}
    return cum, secs, tl


def wait_for(driver, fn, timeout=30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: fn(d))


def choose(driver, name, value):
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("css selector", f'#compare-controls [name="{name}"]')).select_by_value(value)


def type_into(driver, name, text):
    box = driver.find_element("css selector", f'#compare-controls [name="{name}"]')
    box.clear()
    box.send_keys(text)
    driver.find_element("css selector", "#compare-controls button[type=submit]").click()


def test_run_page_draws_the_metrics_of_the_endpoint(server, browser):  # noqa: F811
    open_page(browser, server.url + "/ui/runs/beta-s1?refresh=0")
    got = series(browser, "chart-evals")
    want = api(server, "/v1/runs/beta-s1/metrics")
    assert got["x"] == [i["step"] for i in want["items"]] == EVAL_STEPS
    assert set(got["series"]) == set(want["names"]) == {"eval/accuracy", "eval_loss"}
    assert got["series"]["eval/accuracy"] == pytest.approx(RUNS["beta-s1"][3])
    assert got["series"]["eval_loss"] == pytest.approx([2.0 - a for a in RUNS["beta-s1"][3]])
    assert browser.find_elements("css selector", "#chart-evals canvas")
    assert "2 metrics at 3 steps" in browser.find_element("id", "evals-note").text
    assert_no_console_errors(browser)


def test_compare_eval_metric_on_each_x_axis(server, browser):  # noqa: F811
    ids = ["beta-s1", "unif-s1"]
    open_page(browser, server.url + "/ui/compare?refresh=0&metric=eval/accuracy&runs=" + ",".join(ids))
    got = series(browser, "chart-eval")
    assert got["x"] == EVAL_STEPS and list(got["series"]) == ids
    for rid in ids:
        assert got["series"][rid] == pytest.approx(RUNS[rid][3])
    # smoothing and log controls are on the page
    assert browser.find_element("id", "smooth").is_displayed()
    assert browser.find_element("css selector", '.chart-tools[data-for="chart-eval"] input[name=log]').is_displayed()

    # x: cumulative rollouts. Each run's points sit at its own rollouts so far.
    choose(browser, "x", "rollouts")
    wait_for(browser, lambda d: series(d, "chart-eval").get("x") != EVAL_STEPS)
    got = series(browser, "chart-eval")
    cums = {rid: cumulative(server, rid) for rid in ids}
    xs = sorted({cums[rid][0][st] for rid in ids for st in EVAL_STEPS})
    assert got["x"] == xs
    for rid in ids:
        pts = {x: v for x, v in zip(got["x"], got["series"][rid]) if v is not None}
        assert pts == pytest.approx({cums[rid][0][st]: a for st, a in zip(EVAL_STEPS, RUNS[rid][3])})
    eff = series(browser, "chart-effective")
    assert eff["x"] == sorted({cums[rid][0][t["step"]] for rid in ids for t in cums[rid][2]})
    assert "x=rollouts" in browser.current_url
    axis = browser.execute_script("return document.getElementById('chart-eval').uplot.axes[0].label")
    assert axis == "cumulative rollouts"

    # x: wall time, seconds since each run's first step (from the timeline's times)
    choose(browser, "x", "time")
    wait_for(browser, lambda d: series(d, "chart-eval").get("x") != xs)
    got = series(browser, "chart-eval")
    for rid in ids:
        pts = {x: v for x, v in zip(got["x"], got["series"][rid]) if v is not None}
        assert pts == pytest.approx({cums[rid][1][st]: a for st, a in zip(EVAL_STEPS, RUNS[rid][3])})
    assert browser.execute_script("return document.getElementById('chart-eval').uplot.axes[0].label") == "wall time (s)"
    choose(browser, "x", "step")
    wait_for(browser, lambda d: series(d, "chart-eval").get("x") == EVAL_STEPS)
    assert_no_console_errors(browser)


def test_rollouts_to_reach_a_threshold_with_the_baseline_ratio(server, browser):  # noqa: F811
    ids = list(RUNS)
    open_page(browser, server.url + "/ui/compare?refresh=0&metric=eval/accuracy&runs=" + ",".join(ids))
    choose(browser, "baseline", "unif-s1")
    type_into(browser, "threshold", "0.5")
    wait_for(browser, lambda d: attrs(d, "#reach tbody tr", "data-ratio")[0] != "")
    cum = {rid: cumulative(server, rid)[0] for rid in ids}
    first = {rid: next(st for st, a in zip(EVAL_STEPS, RUNS[rid][3]) if a >= 0.5) for rid in ids}
    want = {rid: cum[rid][first[rid]] for rid in ids}
    assert first == {"beta-s1": 3, "beta-s2": 3, "unif-s1": 5, "unif-s2": 5}
    assert attrs(browser, "#reach tbody tr", "data-run") == ids
    assert [int(v) for v in attrs(browser, "#reach tbody tr", "data-rollouts")] == [want[r] for r in ids]
    assert [int(v) for v in attrs(browser, "#reach tbody tr", "data-step")] == [first[r] for r in ids]
    ratios = [float(v) for v in attrs(browser, "#reach tbody tr", "data-ratio")]
    assert ratios == pytest.approx([want[r] / want["unif-s1"] for r in ids])
    assert ratios[0] < 1 and ratios[2] == 1
    row = browser.find_element("css selector", '#reach tr[data-run="beta-s1"]').text
    assert f"{want['beta-s1']:,}" in row and f"{want['beta-s1'] / want['unif-s1']:.2f}×" in row
    assert "(baseline)" in browser.find_element("css selector", '#reach tr[data-run="unif-s1"]').text
    # an unreachable threshold says so; the URL keeps threshold and baseline
    type_into(browser, "threshold", "0.95")
    wait_for(browser, lambda d: attrs(d, "#reach tbody tr", "data-rollouts") == [""] * 4)
    assert "not reached" in browser.find_element("id", "reach").text
    assert "threshold=0.95" in browser.current_url and "baseline=unif-s1" in browser.current_url

    # wasted rollouts per run: the timeline's totals and shares
    suspects = {}
    for rid in ids:
        tl = cumulative(server, rid)[2]
        n = sum(t["rollouts"] for t in tl)
        w = sum(t["wasted_rollouts"] for t in tl)
        p, f = sum(t["wasted_all_solved"] for t in tl), sum(t["wasted_all_failed"] for t in tl)
        cells = [td.text for td in browser.find_elements("css selector", f'#waste tr[data-run="{rid}"] td')]
        if rid in WITH_TOKENS:
            tk, wt = sum(t["tokens"] for t in tl), sum(t["wasted_tokens"] for t in tl)
            tok_cells = [f"{tk:,}", f"{wt:,}", f"{100 * wt / tk:.1f}%"]
        else:
            tok_cells = ["–", "–", "–"]
        # wrong-label suspects: the rollouts of the data-quality view's `broken` findings
        broken = api(server, f"/v1/runs/{rid}/data-quality", kind="broken", limit=1000)
        assert broken["next_cursor"] is None
        br = sum(i["rollouts"] for i in broken["items"])
        suspects[rid] = br
        assert cells[1:] == [f"{n:,}", f"{w:,}", f"{100 * w / n:.1f}%", f"{p:,}", f"{100 * p / n:.1f}%", f"{f:,}",
                             f"{100 * f / n:.1f}%", f"{w - p - f:,}", f"{br:,}", f"{100 * br / n:.1f}%",
                             *tok_cells], (rid, cells)
        waste = json.loads(browser.find_element("css selector", f'#waste tr[data-run="{rid}"]').get_attribute("data-waste"))
        assert (waste["wrong_label"], waste["wrong_label_prompts"]) == (br, len(broken["items"]))
    assert any(suspects.values()), suspects  # the check is not vacuous
    assert_no_console_errors(browser)


def test_wasted_rollouts_table_survives_a_failing_data_quality_request(server, browser):  # noqa: F811
    """A run whose data-quality request fails shows "–" for its wrong-label suspects; the
    other runs and the rest of its row are drawn as usual."""
    ids = ["beta-s1", "unif-s1"]
    fail = """
      const real = window.fetch;
      window.fetch = (url, ...rest) => String(url).includes('/v1/runs/unif-s1/data-quality')
        ? Promise.resolve(new Response(JSON.stringify({detail: 'boom'}), {status: 500, headers: {'content-type': 'application/json'}}))
        : real(url, ...rest);"""
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": fail})
    try:
        open_page(browser, server.url + "/ui/compare?refresh=0&runs=" + ",".join(ids))
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})
    assert attrs(browser, "#waste tbody tr", "data-run") == ids
    cell = lambda rid, name: browser.find_element(  # noqa: E731
        "css selector", f'#waste tr[data-run="{rid}"] td[data-cell="{name}"]').text
    assert cell("unif-s1", "wrong-label") == "–" and cell("unif-s1", "wrong-label-share") == "–"
    waste = json.loads(browser.find_element("css selector", '#waste tr[data-run="unif-s1"]').get_attribute("data-waste"))
    assert waste["wrong_label"] is None and waste["rollouts"] > 0
    br = sum(i["rollouts"] for i in api(server, "/v1/runs/beta-s1/data-quality", kind="broken", limit=1000)["items"])
    assert cell("beta-s1", "wrong-label") == f"{br:,}"
    assert list(series(browser, "chart-effective")["series"]) == ids
    assert_no_console_errors(browser)


def test_seeds_grouped_by_a_metadata_key(server, browser):  # noqa: F811
    ids = list(RUNS)
    open_page(browser, server.url + "/ui/compare?refresh=0&metric=eval/accuracy&group=setting&runs=" + ",".join(ids))
    got = series(browser, "chart-eval")
    assert got["x"] == EVAL_STEPS
    assert list(got["series"]) == ["setting=beta mean (2 runs)", "setting=beta − 1 sd", "setting=beta + 1 sd",
                                   "setting=uniform mean (2 runs)", "setting=uniform − 1 sd", "setting=uniform + 1 sd"]
    import statistics

    for setting, members in (("beta", ["beta-s1", "beta-s2"]), ("uniform", ["unif-s1", "unif-s2"])):
        vals = list(zip(*(RUNS[m][3] for m in members)))
        mean = [statistics.mean(v) for v in vals]
        sd = [statistics.stdev(v) for v in vals]
        assert got["series"][f"setting={setting} mean (2 runs)"] == pytest.approx(mean)
        assert got["series"][f"setting={setting} − 1 sd"] == pytest.approx([m - s for m, s in zip(mean, sd)])
        assert got["series"][f"setting={setting} + 1 sd"] == pytest.approx([m + s for m, s in zip(mean, sd)])
    import json

    groups = json.loads(browser.find_element("id", "chart-eval").get_attribute("data-groups"))
    assert groups == [{"label": "setting=beta", "runs": ["beta-s1", "beta-s2"]},
                      {"label": "setting=uniform", "runs": ["unif-s1", "unif-s2"]}]
    assert_no_console_errors(browser)


def test_a_missing_run_is_named_and_the_others_drawn(server, browser):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/ui/compare?refresh=0&metric=eval/accuracy&runs=beta-s1,no-such-run,unif-s1")
    WebDriverWait(browser, 60).until(lambda d: int(d.execute_script("return document.body.dataset.loaded || 0")) >= 1)
    note = browser.find_element("id", "compare-missing")
    assert note.is_displayed() and "no-such-run" in note.text and "404" in note.text
    assert attrs(browser, "#compare-missing [data-missing]", "data-missing") == ["no-such-run"]
    assert list(series(browser, "chart-eval")["series"]) == ["beta-s1", "unif-s1"]
    assert list(series(browser, "chart-effective")["series"]) == ["beta-s1", "unif-s1"]
    assert attrs(browser, "#cards tbody tr", "data-run") == ["beta-s1", "unif-s1"]
    # the only console errors are the failed fetch of the missing run
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert all("no-such-run" in e["message"] and "404" in e["message"] for e in errors), errors


def test_png_export_carries_title_and_legend(server, browser):  # noqa: F811
    ids = ["beta-s1", "unif-s1"]
    open_page(browser, server.url + "/ui/compare?refresh=0&metric=eval/accuracy&runs=" + ",".join(ids))
    link = browser.find_element("css selector", '.chart-tools[data-for="chart-eval"] a.dl-png')
    link.click()
    import json

    legend = json.loads(link.get_attribute("data-legend"))
    assert [e["label"] for e in legend] == ids
    colors = browser.execute_script("return RP.COLORS")
    assert [e["color"] for e in legend] == colors[:2]
    width, height, chart_w, chart_h = json.loads(link.get_attribute("data-size"))
    assert width == chart_w and height > chart_h
    # Decode the PNG itself: each legend swatch is its series' colour; the title band has ink.
    probe = browser.execute_async_script("""
        const [url, boxes, done] = arguments;
        const img = new Image();
        img.onload = () => {
          const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
          const g = c.getContext('2d'); g.drawImage(img, 0, 0);
          const px = boxes.map(b => Array.from(g.getImageData(b.x + b.size / 2, b.y + b.size / 2, 1, 1).data));
          const top = g.getImageData(0, 0, img.width, Math.round(20 * (window.devicePixelRatio || 1))).data;
          let ink = 0; for (let i = 0; i < top.length; i += 4) if (top[i] < 128) ink++;
          done({px, ink, w: img.width, h: img.height});
        };
        img.src = url;""", link.get_attribute("href"), legend)
    assert [probe["w"], probe["h"]] == [width, height]
    for got, e in zip(probe["px"], legend):
        want = [int(e["color"][k:k + 2], 16) for k in (1, 3, 5)]
        assert got[:3] == want and got[3] == 255, (got, e)
    assert probe["ink"] > 50  # the title's text
    assert link.get_attribute("download") == "compare-eval.png"
    assert_no_console_errors(browser)


def test_compare_on_cumulative_tokens(server, browser):  # noqa: F811
    """x = cumulative tokens: each run's eval points sit at the tokens it had reported by
    then (a run whose reports carry no tokens has none); the tokens and wasted tokens per
    step are drawn; the reach table gives tokens and, on this axis, the ratio in tokens."""
    ids = ["beta-s1", "unif-s1", "unif-s2"]
    open_page(browser, server.url + "/ui/compare?refresh=0&metric=eval/accuracy&x=tokens&runs=" + ",".join(ids))
    assert browser.execute_script("return document.getElementById('chart-eval').uplot.axes[0].label") == \
        "cumulative tokens"
    cum = {rid: cumulative_tokens(server, rid) for rid in ids}
    got = series(browser, "chart-eval")
    assert got["x"] == sorted({cum[rid][st] for rid in WITH_TOKENS & set(ids) for st in EVAL_STEPS})
    for rid in ids:
        pts = {x: v for x, v in zip(got["x"], got["series"][rid]) if v is not None}
        want = {cum[rid][st]: a for st, a in zip(EVAL_STEPS, RUNS[rid][3])} if rid in WITH_TOKENS else {}
        assert pts == pytest.approx(want), rid
    tl = {rid: api(server, f"/v1/runs/{rid}/timeline")["items"] for rid in ids}
    for cid, key in (("chart-tokens", "tokens"), ("chart-wasted-tokens", "wasted_tokens")):
        ch = series(browser, cid)
        for rid in ("beta-s1", "unif-s1"):
            pts = {x: v for x, v in zip(ch["x"], ch["series"][rid]) if v is not None}
            assert pts == {cum[rid][t["step"]]: t[key] for t in tl[rid]}, (cid, rid)
        assert all(v is None for v in ch["series"]["unif-s2"])
    choose(browser, "baseline", "unif-s1")
    type_into(browser, "threshold", "0.5")
    wait_for(browser, lambda d: attrs(d, "#reach tbody tr", "data-ratio")[0] != "")
    first = {"beta-s1": 3, "unif-s1": 5, "unif-s2": 5}
    assert [int(v) for v in attrs(browser, "#reach tbody tr", "data-tokens")[:2]] == \
        [cum["beta-s1"][3], cum["unif-s1"][5]]
    assert attrs(browser, "#reach tbody tr", "data-tokens")[2] == ""
    ratios = attrs(browser, "#reach tbody tr", "data-ratio")
    assert float(ratios[0]) == pytest.approx(cum["beta-s1"][first["beta-s1"]] / cum["unif-s1"][first["unif-s1"]])
    assert ratios[2] == ""  # no tokens: no ratio in tokens
    assert "ratio: tokens / unif-s1's" in browser.find_element("id", "reach-what").text
    assert "x=tokens" in browser.current_url
    assert_no_console_errors(browser)


def test_run_page_cards_give_tokens_where_reports_carry_them(server, browser):  # noqa: F811
    for rid in ("beta-s1", "unif-s2"):
        open_page(browser, server.url + f"/ui/runs/{rid}?refresh=0")
        cards = {c.get_attribute("data-card"): c.text for c in browser.find_elements("css selector", "#cards .card")}
        if rid in WITH_TOKENS:
            tl = api(server, f"/v1/runs/{rid}/timeline")["items"]
            tk, wt = sum(t["tokens"] for t in tl), sum(t["wasted_tokens"] for t in tl)
            assert f"{tk:,}" in cards["tokens"] and f"{wt:,}" in cards["wasted-tokens"]
            assert f"({100 * wt / tk:.1f}%)" in cards["wasted-tokens"]
        else:
            assert "tokens" not in cards and "wasted-tokens" not in cards
    assert_no_console_errors(browser)
