"""The runs table (sort, search, both kept in the URL) and the run comparison page, in a
real headless Chromium against a real ``rollplan serve`` (see test_dashboard_browser.py
for what it needs and the skip / ROLLPLAN_REQUIRE_BROWSER logic, reused here).

Five runs: three simulated with different strategies, pool sizes and step ranges (one
with a gap and prompts of an extra domain and of none, one with a trailing plan that has
no results yet), a tiny one, and one with nothing in it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import pytest
from conftest import ServerProcess
from sim import simulate
from test_dashboard_browser import (
    MISSING,
    REQUIRE,
    api,
    assert_no_console_errors,
    attrs,
    browser,  # noqa: F401  (the module's Chromium fixture)
    open_page,
    series,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None and not REQUIRE, reason=f"browser tests need Chromium: {MISSING}"),
]

COMPARED = ["alpha-run", "bravo-run", "charlie-run"]
SIMS = [
    dict(run_id="alpha-run", strategy="beta", n_prompts=60, steps=6, batch_size=8, rollouts=8, seed=1),
    dict(run_id="bravo-run", strategy="uniform", n_prompts=30, steps=4, batch_size=6, rollouts=4, seed=2),
    dict(run_id="charlie-run", strategy="frontier", n_prompts=90, steps=8, batch_size=10, rollouts=8, seed=3),
    dict(run_id="delta-extra", strategy="beta", n_prompts=20, steps=2, batch_size=4, rollouts=4, seed=4),
]
CHARTS = {
    "chart-effective": lambda s: s["effective_ratio"],
    "chart-informative": lambda s: s["informative_rollouts"],
    "chart-wasted": lambda s: s["wasted_rollouts"],
    "chart-reward": lambda s: s["mean_reward"],
    "chart-brier": lambda s: s["calibration"]["brier"] if s["calibration"] else None,
    "chart-compute": lambda s: s["plan"]["compute_ms"] if s["plan"] else None,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("ui-compare")
    srv = ServerProcess(f"sqlite:///{d / 'ui.db'}", d).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            for kw in SIMS:
                simulate(c, **kw)
            # charlie: prompts of another domain and of none, then a step after a gap.
            extra = [{"id": f"chem/{i}", "domain": "chem"} for i in range(12)] + [{"id": f"misc/{i}"} for i in range(6)]
            assert c.post("/v1/runs/charlie-run/prompts", json={"prompts": extra}).status_code == 200
            plan = c.post("/v1/runs/charlie-run/plans", json={"batch_size": 30, "step": 11}).json()
            rng = np.random.default_rng(5)
            results = [
                {"prompt_id": it["prompt_id"], "rewards": rng.binomial(1, 0.5, it["rollouts"]).astype(float).tolist()}
                for it in plan["items"]
            ]
            r = c.post(
                "/v1/runs/charlie-run/results",
                json={"report_id": "late", "plan_id": plan["plan_id"], "step": 11, "results": results},
            )
            assert r.status_code == 200, r.text
            # alpha: a plan at step 6 whose results have not come in.
            assert c.post("/v1/runs/alpha-run/plans", json={"batch_size": 8, "step": 6}).status_code == 201
            # echo: a run with no prompts and no steps (no effective ratio).
            r = c.put("/v1/runs/echo-empty", json={"strategy": {"name": "uniform"}, "rollouts_per_prompt": 4})
            assert r.status_code == 201, r.text
        yield srv
    finally:
        srv.stop()


# -- helpers ----------------------------------------------------------------------------
def wait_loaded(driver):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 60).until(lambda d: int(d.execute_script("return document.body.dataset.loaded || 0")) >= 1)


def rows(driver, table="#runs"):
    return attrs(driver, f"{table} tbody tr", "data-run")


def query(driver) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(driver.current_url).query).items()}


def expected_order(runs, key, order, text=""):
    """What the runs table shows: `text`'s terms each in the id or the strategy; sorted by
    `key` with runs without a value last, ties by id."""

    def created_ms(r):
        return (datetime.fromisoformat(r["created_at"]) - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(
            milliseconds=1
        )

    get = {
        "run": lambda r: r["id"],
        "strategy": lambda r: r["strategy"]["name"],
        "rollouts": lambda r: r["stats"]["rollouts"],
        "prompts": lambda r: r["stats"]["prompts"],
        "effective": lambda r: (
            r["stats"]["informative_rollouts"] / r["stats"]["rollouts"] if r["stats"]["rollouts"] else None
        ),
        "created": created_ms,
        "last_report": lambda r: r["stats"]["last_report_at"],
    }[key]
    terms = text.lower().split()
    shown = [r for r in runs if all(t in r["id"].lower() or t in r["strategy"]["name"].lower() for t in terms)]
    with_value = sorted((r for r in shown if get(r) is not None), key=lambda r: r["id"])
    with_value.sort(key=get, reverse=order == "desc")  # stable: ties stay in id order
    return [r["id"] for r in with_value] + sorted(r["id"] for r in shown if get(r) is None)


def set_search(driver, text):
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element("id", "runs-search")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)
    if text:
        box.send_keys(text)


def sort_by(driver, key):
    driver.find_element("css selector", f'#runs thead button[data-sort="{key}"]').click()


def same(got, want):
    """Equal lists of numbers or None (JSON's null)."""
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        assert (g is None and w is None) or (g is not None and w is not None and g == pytest.approx(w)), (got, want)


def domain_shares(dom):
    """A run's share of planned prompts per domain ("" for none) over all steps, and at the
    latest step with a batch share."""
    total: dict[str, int] = {}
    for st in dom["items"]:
        for d in st["domains"]:
            total[d["domain"] or ""] = total.get(d["domain"] or "", 0) + d["planned_prompts"]
    n = sum(total.values())
    latest = [st for st in dom["items"] if any(d["batch_share"] is not None for d in st["domains"])][-1]
    last = {d["domain"] or "": d["batch_share"] for d in latest["domains"] if d["batch_share"] is not None}
    keys = set(total) | {d or "" for d in dom["domains"]}
    return {k: v / n for k, v in total.items()}, last, keys


def check_compare_page(driver, server, ids):
    """Every chart holds each run's timeline on the union of the runs' steps; the cards and
    the domain tables list the runs."""
    timelines = {i: api(server, f"/v1/runs/{i}/timeline")["items"] for i in ids}
    x = sorted({s["step"] for tl in timelines.values() for s in tl})
    assert len({tuple(s["step"] for s in tl) for tl in timelines.values()}) == len(ids), "step ranges differ per run"
    for cid, value in CHARTS.items():
        got = series(driver, cid)
        assert got["x"] == x, cid
        assert list(got["series"]) == ids, cid
        for i in ids:
            by_step = {s["step"]: s for s in timelines[i]}
            same(got["series"][i], [value(by_step[st]) if st in by_step else None for st in x])
        assert driver.find_elements("css selector", f"#{cid} canvas"), cid
        legend = driver.find_element("css selector", f"#{cid} .u-legend").text
        assert all(i in legend for i in ids), (cid, legend)
    # A run without a step has null there, not 0, and a plan without results has no ratio.
    eff = series(driver, "chart-effective")["series"]
    if "alpha-run" in ids:
        assert eff["alpha-run"][x.index(6)] is None  # planned, no results yet
        if "charlie-run" in ids:
            assert eff["alpha-run"][x.index(11)] is None and eff["charlie-run"][x.index(11)] is not None

    assert rows(driver, "#cards") == ids
    for i in ids:
        run = api(server, f"/v1/runs/{i}")
        st = run["stats"]
        cells = {
            c.get_attribute("data-card"): c.text
            for c in driver.find_elements("css selector", f'#cards tr[data-run="{i}"] td[data-card]')
        }
        row = driver.find_element("css selector", f'#cards tr[data-run="{i}"]').text
        assert run["strategy"]["name"] in row
        assert cells["prompts"] == f"{st['prompts']:,}" and cells["steps"] == f"{st['steps']:,}"
        assert cells["rollouts"] == f"{st['rollouts']:,}"
        assert cells["effective"] == f"{100 * st['informative_rollouts'] / st['rollouts']:.1f}%"
        tl = [s for s in timelines[i] if s["rollouts"]]
        mean = sum(s["mean_reward"] * s["rollouts"] for s in tl) / sum(s["rollouts"] for s in tl)
        assert cells["reward"] == f"{mean:.3f}"
        assert cells["range"] == f"{timelines[i][0]['step']}–{timelines[i][-1]['step']}"

    doms = {i: domain_shares(api(server, f"/v1/runs/{i}/domains")) for i in ids}
    keys = sorted(set().union(*(k for _, _, k in doms.values())), key=lambda k: (k == "", k))
    if "charlie-run" in ids:
        assert {"chem", ""} <= set(keys)
    for table, which in (("#domain-shares", 0), ("#domain-shares-last", 1)):
        assert attrs(driver, f"{table} tbody tr", "data-domain") == keys
        assert attrs(driver, f"{table} thead th[data-run]", "data-run") == ids
        for i in ids:
            want = doms[i][which]
            got = attrs(driver, f'{table} tbody td[data-run="{i}"]', "data-share")
            same([float(g) if g else None for g in got], [want.get(k) for k in keys])
    assert_no_console_errors(driver)


# -- tests ------------------------------------------------------------------------------
def test_runs_table_sorts_searches_and_keeps_both_in_the_url(server, browser):  # noqa: F811
    runs = api(server, "/v1/runs")["items"]
    assert len(runs) == 5
    open_page(browser, server.url + "/ui/?refresh=0")
    headers = [h.text for h in browser.find_elements("css selector", "#runs thead th")]
    assert headers[1:] == ["run", "strategy", "prompts", "steps", "rollouts", "effective ratio", "last report", "created"]
    assert rows(browser) == expected_order(runs, "created", "desc")
    shown = dict(zip(rows(browser), attrs(browser, "#runs tbody td[data-last-report]", "data-last-report")))
    assert shown == {r["id"]: r["stats"]["last_report_at"] or "" for r in runs}
    sort_by(browser, "last_report")  # latest report first, runs without one last
    assert rows(browser) == expected_order(runs, "last_report", "desc")
    stats = {r["id"]: r["stats"] for r in runs}
    ratios = attrs(browser, "#runs tbody td[data-ratio]", "data-ratio")
    for rid, ratio in zip(rows(browser), ratios):  # informative_rollouts / rollouts
        s = stats[rid]
        same(
            [None if ratio == "null" else float(ratio)],
            [s["informative_rollouts"] / s["rollouts"] if s["rollouts"] else None],
        )

    sort_by(browser, "rollouts")
    assert rows(browser) == expected_order(runs, "rollouts", "desc")
    assert query(browser) == {"refresh": "0", "sort": "rollouts", "order": "desc"}
    sort_by(browser, "rollouts")
    assert rows(browser) == expected_order(runs, "rollouts", "asc")
    sort_by(browser, "effective")  # the empty run has no ratio: last either way
    assert rows(browser) == expected_order(runs, "effective", "desc") and rows(browser)[-1] == "echo-empty"
    sort_by(browser, "effective")
    assert rows(browser) == expected_order(runs, "effective", "asc") and rows(browser)[-1] == "echo-empty"
    sort_by(browser, "strategy")
    assert rows(browser) == expected_order(runs, "strategy", "asc")
    th = browser.find_element("css selector", '#runs thead button[data-sort="strategy"]').find_element("xpath", "..")
    assert th.get_attribute("aria-sort") == "ascending"

    set_search(browser, "uniform")  # by strategy
    assert rows(browser) == expected_order(runs, "strategy", "asc", "uniform") == ["bravo-run", "echo-empty"]
    set_search(browser, "RUN beta")  # every term, either field, any case
    assert rows(browser) == ["alpha-run"]
    assert query(browser) == {"refresh": "0", "sort": "strategy", "order": "asc", "q": "RUN beta"}
    set_search(browser, "-run")
    want = expected_order(runs, "strategy", "asc", "-run")
    assert rows(browser) == want and set(want) == set(COMPARED)
    assert "3 of 5 runs" in browser.find_element("id", "runs-count").text

    # A reload keeps the sort and the search (they are in the URL).
    url = browser.current_url
    browser.refresh()
    wait_loaded(browser)
    assert browser.current_url == url
    assert browser.find_element("id", "runs-search").get_attribute("value") == "-run"
    assert rows(browser) == want
    th = browser.find_element("css selector", '#runs thead button[data-sort="strategy"]').find_element("xpath", "..")
    assert th.get_attribute("aria-sort") == "ascending"
    set_search(browser, "")
    assert rows(browser) == expected_order(runs, "strategy", "asc")
    assert "q" not in query(browser)
    assert_no_console_errors(browser)


def test_tick_three_runs_and_compare(server, browser):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, server.url + "/ui/?refresh=0&q=-run")
    button = browser.find_element("id", "compare")
    assert not button.is_enabled()
    for n, rid in enumerate(COMPARED, 1):
        browser.find_element("css selector", f'#runs input[data-select="{rid}"]').click()
        assert button.is_enabled() == (n >= 2), n
    assert "3 selected" in browser.find_element("id", "compare-note").text
    # The selection survives a new search that hides part of it.
    set_search(browser, "charlie")
    assert rows(browser) == ["charlie-run"]
    assert browser.find_element("css selector", '#runs input[data-select="charlie-run"]').is_selected()
    button.click()
    WebDriverWait(browser, 30).until(lambda d: "/ui/compare" in d.current_url)
    wait_loaded(browser)
    assert query(browser) == {"runs": ",".join(COMPARED), "refresh": "0"}
    assert "bad" not in browser.find_element("id", "status").get_attribute("class")
    check_compare_page(browser, server, COMPARED)


def test_compare_page_from_its_url(server, browser):  # noqa: F811
    ids = ["charlie-run", "bravo-run", "alpha-run", "delta-extra"]
    open_page(browser, server.url + "/ui/compare?runs=" + ",".join(ids) + "&refresh=0")
    check_compare_page(browser, server, ids)


def test_compare_page_refreshes_while_live_and_names_errors(server, browser):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    # Without ?refresh= the page polls: a new step of one run shows up without a reload.
    ids = ["alpha-run", "bravo-run"]
    open_page(browser, server.url + "/ui/compare?runs=" + ",".join(ids) + "&refresh=1")
    assert 20 not in series(browser, "chart-informative")["x"]
    with httpx.Client(base_url=server.url, timeout=60) as c:
        plan = c.post("/v1/runs/bravo-run/plans", json={"batch_size": 6, "step": 20}).json()
        r = c.post(
            "/v1/runs/bravo-run/results",
            json={
                "report_id": "live",
                "step": 20,
                "plan_id": plan["plan_id"],
                "results": [
                    {"prompt_id": it["prompt_id"], "rewards": [float(k % 2) for k in range(it["rollouts"])]}
                    for it in plan["items"]
                ],
            },
        )
        assert r.status_code == 200, r.text
    WebDriverWait(browser, 60).until(lambda d: series(d, "chart-informative")["x"][-1] == 20)
    check_compare_page(browser, server, ids)

    browser.get(server.url + "/ui/compare?runs=alpha-run,no-such-run&refresh=0")
    wait_loaded(browser)
    # A run that does not exist is named and left out; the others are drawn.
    note = browser.find_element("id", "compare-missing")
    assert note.is_displayed() and "no-such-run" in note.text and "404" in note.text
    assert list(series(browser, "chart-informative")["series"]) == ["alpha-run"]
    browser.get(server.url + "/ui/compare?refresh=0")
    wait_loaded(browser)
    assert browser.find_element("id", "compare-empty").is_displayed()


def test_compare_with_from_a_run_page_starts_with_that_run_ticked(server, browser):  # noqa: F811
    runs = api(server, "/v1/runs")["items"]
    rid = runs[0]["id"]
    open_page(browser, server.url + f"/ui/runs/{rid}?refresh=0")
    link = browser.find_element("id", "compare-with")
    assert link.get_attribute("href").endswith("/ui/?select=" + rid)
    open_page(browser, link.get_attribute("href"))
    ticked = attrs(browser, "#runs tbody input[data-select]:checked", "data-select")
    assert ticked == [rid]
    assert_no_console_errors(browser)
