"""The dashboard in a real headless Chromium (Selenium + Debian's chromium and
chromium-driver packages) against a real ``rollplan serve`` filled by a simulated run.

Needs: ``apt-get install -y chromium chromium-driver`` and ``pip install -e '.[dev]'``
(selenium is in the ``ui-test`` extra, included in ``dev``). Without Chromium these
tests are skipped with the reason — unless ``ROLLPLAN_REQUIRE_BROWSER=1`` (as in CI),
where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
from urllib.parse import quote

import httpx
import pytest
from conftest import ServerProcess
from sim import simulate

CHROMIUM = os.environ.get("ROLLPLAN_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ROLLPLAN_CHROMEDRIVER", shutil.which("chromedriver") or "/usr/bin/chromedriver")
REQUIRE = os.environ.get("ROLLPLAN_REQUIRE_BROWSER", "") not in ("", "0", "false")
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for what, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)):
        if not os.access(path, os.X_OK):
            return f"{what} not found at {path} (apt-get install -y chromium chromium-driver)"
    return None


MISSING = _missing()
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None and not REQUIRE, reason=f"browser tests need Chromium: {MISSING}"),
]

SIM = dict(run_id="sim-run", n_prompts=300, steps=20, batch_size=32, rollouts=8, seed=7)


def make_driver(profile_dir):
    if MISSING is not None:
        pytest.fail(f"ROLLPLAN_REQUIRE_BROWSER is set but {MISSING}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile_dir}")
    opts.add_argument("--window-size=1400,1000")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One real server on SQLite with a 300-prompt, 20-step simulated run."""
    d = tmp_path_factory.mktemp("ui")
    server = ServerProcess(f"sqlite:///{d / 'ui.db'}", d).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            sim = simulate(c, **SIM)
        yield server, sim
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = make_driver(tmp_path_factory.mktemp("chromium-profile"))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def api(server, path, **params):
    r = httpx.get(server.url + path, params=params, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def open_page(driver, url):
    """Load a page and wait until its first data load finished."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop entries of earlier pages
    driver.get(url)
    WebDriverWait(driver, 60).until(lambda d: int(d.execute_script("return document.body.dataset.loaded || 0")) >= 1)
    assert "bad" not in driver.find_element("id", "status").get_attribute("class"), \
        driver.find_element("id", "status").text


def assert_no_console_errors(driver):
    logs = driver.get_log("browser")
    errors = [e for e in logs if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors


def attrs(driver, css, attr):
    """An attribute of every element matching ``css``, read in one go (no stale elements)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.getAttribute(arguments[1]))", css, attr)


def series(driver, element_id):
    return json.loads(driver.find_element("id", element_id).get_attribute("data-series"))


def test_runs_page(live, browser):
    server, sim = live
    open_page(browser, server.url + "/ui/?refresh=0")
    row = browser.find_element("css selector", f'tr[data-run="{sim.run_id}"]')
    stats = api(server, f"/v1/runs/{sim.run_id}")["stats"]
    assert f"{stats['rollouts']:,}" in row.text and "beta" in row.text
    assert_no_console_errors(browser)


def test_run_page_charts_show_the_api_data(live, browser):
    server, sim = live
    base = f"/v1/runs/{sim.run_id}"
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")

    tl = api(server, base + "/timeline")["items"]
    got = series(browser, "chart-rollouts")
    assert got["x"] == [t["step"] for t in tl] == list(range(SIM["steps"]))
    assert got["series"]["rollouts"] == [t["rollouts"] for t in tl]
    assert got["series"]["informative"] == [t["informative_rollouts"] for t in tl]
    assert got["series"]["wasted: all solved"] == [t["wasted_all_solved"] for t in tl]
    assert got["series"]["wasted: all failed"] == [t["wasted_all_failed"] for t in tl]
    assert series(browser, "chart-reward")["series"]["mean reward"] == pytest.approx([t["mean_reward"] for t in tl])
    assert series(browser, "chart-calibration")["series"]["Brier"] == pytest.approx([t["calibration"]["brier"] for t in tl])
    assert series(browser, "chart-latency")["series"]["compute ms"] == pytest.approx([t["plan"]["compute_ms"] for t in tl])
    assert series(browser, "chart-tokens")["series"]["tokens"] == [t["tokens"] for t in tl]  # None: not reported

    hist = api(server, base + "/pass-rate-histogram", bins=20)
    heat = series(browser, "heatmap")
    assert heat["steps"] == [h["step"] for h in hist["items"]]
    assert heat["counts"] == [h["counts"] for h in hist["items"]]
    assert len(heat["counts"][0]) == 20 and sum(heat["counts"][-1]) == SIM["n_prompts"]
    states = series(browser, "chart-states")["series"]
    assert states["frontier"] == [h["states"]["frontier"] for h in hist["items"]]

    dom = api(server, base + "/domains")
    shares = series(browser, "chart-domains")["series"]
    assert set(shares) == {"math", "code", "logic"}
    for name in shares:
        want = [next(d["batch_share"] for d in s["domains"] if d["domain"] == name) if any(
            d["domain"] == name for d in s["domains"]) else 0 for s in dom["items"]]
        assert shares[name] == pytest.approx(want)
    domain_rows = browser.find_elements("css selector", "#domains tbody tr")
    assert sorted(r.get_attribute("data-domain") for r in domain_rows) == ["code", "logic", "math"]

    # The charts were drawn: uPlot canvases and the heatmap canvas have pixels.
    for cid in ("chart-rollouts", "chart-reward", "chart-calibration", "chart-domains", "chart-states"):
        assert browser.find_elements("css selector", f"#{cid} canvas"), cid
    assert browser.execute_script("return document.querySelector('#heatmap canvas').width") > 0

    stats = api(server, base)["stats"]
    cards = {c.get_attribute("data-card"): c.text for c in browser.find_elements("css selector", ".card")}
    assert f"{stats['rollouts']:,}" in cards["rollouts"]
    assert f"{stats['rollouts'] - stats['informative_rollouts']:,}" in cards["wasted"]
    assert '"name": "beta"' in browser.find_element("id", "config").text
    waste = browser.find_element("id", "waste").text
    assert f"{sum(t['wasted_all_solved'] for t in tl):,}" in waste
    # The table opens on the frontier, predicted pass rate closest to 0.5 first: two API
    # listings (p >= 0.5 ascending, p <= 0.5 descending) merged by distance from 0.5.
    up = api(server, base + "/prompts", state="frontier", min_pass_rate=0.5, sort="predicted_pass_rate", order="asc",
             limit=1000)["items"]
    down = api(server, base + "/prompts", state="frontier", max_pass_rate=0.5, sort="predicted_pass_rate",
               order="desc", limit=1000)["items"]
    frontier = {p["id"]: p for p in up + down}
    shown = attrs(browser, "#prompts tbody tr", "data-prompt")
    assert len(shown) == min(50, len(frontier)) and set(shown) <= set(frontier)
    dist = [abs(frontier[i]["predicted_pass_rate"] - 0.5) for i in shown]
    assert dist == sorted(dist)
    assert max(dist) <= min((abs(p["predicted_pass_rate"] - 0.5) for i, p in frontier.items() if i not in shown),
                            default=1)
    assert_no_console_errors(browser)


def test_filter_and_click_through_to_a_prompt(live, browser):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    form = browser.find_element("id", "prompt-filter")
    Select(form.find_element("name", "domain")).select_by_value("code")
    Select(form.find_element("name", "sort")).select_by_value("rollouts")
    Select(form.find_element("name", "order")).select_by_value("desc")
    # The table opens on the frontier; look at all states of one domain by rollouts.
    assert Select(form.find_element("name", "state")).first_selected_option.get_attribute("value") == "frontier"
    Select(form.find_element("name", "state")).select_by_value("")
    want = api(server, f"/v1/runs/{sim.run_id}/prompts", domain="code", sort="rollouts", order="desc", limit=50)["items"]
    form.find_element("css selector", "button[type=submit]").click()
    WebDriverWait(browser, 30).until(lambda d: attrs(d, "#prompts tbody tr", "data-prompt") == [p["id"] for p in want])
    top = want[0]
    assert top["rollouts"] > 0 and top["domain"] == "code"
    browser.find_element("css selector", f'#prompts tr[data-prompt="{top["id"]}"] a').click()
    WebDriverWait(browser, 30).until(lambda d: "/prompts/" in d.current_url)
    WebDriverWait(browser, 60).until(lambda d: int(d.execute_script("return document.body.dataset.loaded || 0")) >= 1)
    assert browser.current_url.endswith("/ui/runs/" + sim.run_id + "/prompts/" + quote(top["id"], safe=""))
    assert browser.find_element("id", "prompt-id").text == top["id"]

    trace = api(server, f"/v1/runs/{sim.run_id}/prompt-history/{quote(top['id'], safe='')}")
    rows = browser.find_elements("css selector", "#history tbody tr")
    assert len(rows) == len(trace["history"]) == top["groups"]
    assert [int(r.get_attribute("data-step")) for r in rows] == [h["step"] for h in trace["history"]]
    est = series(browser, "chart-estimate")
    assert est["x"] == [h["step"] for h in trace["history"]]  # one group per step in this simulation
    assert est["series"]["Beta posterior mean"] == pytest.approx([h["predicted_pass_rate"] for h in trace["history"]])
    assert est["series"]["observed group mean"] == pytest.approx([h["mean_reward"] for h in trace["history"]])
    assert len(browser.find_elements("css selector", "#planned tbody tr")) == len(trace["planned"])
    assert trace["text"] in browser.find_element("id", "prompt-text").text
    assert_no_console_errors(browser)


def test_run_page_refreshes_while_live(live, browser):
    """New reports show up without reloading the page."""
    from selenium.webdriver.support.ui import WebDriverWait

    server, _ = live
    with httpx.Client(base_url=server.url, timeout=60) as c:
        sim = simulate(c, run_id="live-run", n_prompts=40, steps=2, batch_size=8, seed=3)
        open_page(browser, server.url + "/ui/runs/live-run?refresh=1")
        assert series(browser, "chart-rollouts")["x"] == [0, 1]
        plan = c.post("/v1/runs/live-run/plans", json={"batch_size": 8, "step": 2}).json()
        r = c.post("/v1/runs/live-run/results", json={"report_id": "late", "step": 2, "plan_id": plan["plan_id"],
                   "results": [{"prompt_id": it["prompt_id"], "rewards": [1, 0] * 4} for it in plan["items"]]})
        assert r.status_code == 200
    WebDriverWait(browser, 60).until(lambda d: series(d, "chart-rollouts")["x"] == [0, 1, 2])
    assert series(browser, "chart-rollouts")["series"]["informative"][2] == 64
    cov = api(server, "/v1/runs/live-run/coverage")
    seen = f"({cov['seen']:,} of {cov['prompts']:,})"
    WebDriverWait(browser, 30).until(lambda d: seen in d.find_element(
        "css selector", '#coverage-cards [data-card="cov-seen"]').text)
    assert "(24 groups)" in browser.find_element("id", "coverage-note").text  # 3 steps of 8
    assert len(sim.plans) == 2
    assert_no_console_errors(browser)


def test_coverage_panel_shows_the_run_s_memorisation_estimate(live, browser):
    """A `default` run's coverage panel carries its memorisation estimate (the strategy
    state's `memorisation`: re-used prompts' excess pass rate over the prediction beyond
    first-time groups'), signed, as the API gives it; a `beta` run has no such card."""
    from selenium.webdriver.support.ui import WebDriverWait

    server, sim = live
    with httpx.Client(base_url=server.url, timeout=60) as c:
        simulate(c, run_id="memo-run", strategy="default", n_prompts=400, steps=16, batch_size=16, seed=5)
    memo = api(server, "/v1/runs/memo-run")["strategy_state"]["memorisation"]
    # 400 prompts, 16 a step: first-time and re-used prompts in the same steps once the cooldown is past
    assert memo["reused_excess"] is not None and memo["first_time_excess"] is not None, memo
    open_page(browser, server.url + "/ui/runs/memo-run?refresh=0")
    sel = '#coverage-cards [data-card="cov-memo"]'
    WebDriverWait(browser, 30).until(lambda d: d.find_elements("css selector", sel))
    text = browser.find_element("css selector", sel).text
    signed = lambda x: f"{x:+.3f}" if x != int(x) else f"{int(x):+d}"  # noqa: E731 (the page's format)
    assert signed(memo["estimate"]) in text, (memo, text)
    assert f"re-used {signed(memo['reused_excess'])}" in text and f"first-time {signed(memo['first_time_excess'])}" in text
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    WebDriverWait(browser, 30).until(lambda d: d.find_elements("css selector", '#coverage-cards [data-card="cov-seen"]'))
    assert not browser.find_elements("css selector", sel)
    assert_no_console_errors(browser)


def test_coverage_panel_shows_the_api_numbers(live, browser):
    """The run page's coverage panel: the endpoint's headline numbers, its per-domain
    table and its picks-per-window chart (outside the shared step zoom)."""
    server, sim = live
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0&steps=2..5")  # zoomed into steps 2–5
    cov = api(server, f"/v1/runs/{sim.run_id}/coverage")
    assert cov["rollouts"] > 0 and 0 < cov["seen_share"] <= 1
    def pct(text):  # "12.3%" as a share (the page rounds to 0.1%)
        return pytest.approx(float(text.split("%")[0]) / 100, abs=0.0005 + 1e-9)

    cards = {c.get_attribute("data-card"): c.text for c in browser.find_elements("css selector", "#coverage-cards .card")}
    assert cov["top10_share"] == pct(cards["cov-top10"].split("\n")[-1])
    assert cov["seen_share"] == pct(cards["cov-seen"].split("\n")[-1])
    assert f"({cov['seen']:,} of {cov['prompts']:,})" in cards["cov-seen"]
    for key, name in (("cov-median", "median_per_seen"), ("cov-max", "max_per_seen")):
        x = cov[name]
        assert (f"{int(x):,}" if x == int(x) else f"{x:.1f}") in cards[key], (key, cards[key])
    rows = browser.find_elements("css selector", "#coverage-domains tbody tr")
    assert [r.get_attribute("data-domain") for r in rows] == [d["domain"] for d in cov["domains"]] == [
        "code", "logic", "math"]
    for r, d in zip(rows, cov["domains"]):
        cells = [td.text for td in r.find_elements("css selector", "td")]
        assert (cells[1], cells[3]) == (f"{d['prompts']:,}", f"{d['rollouts']:,}"), cells
        assert (d["seen_share"], d["rollout_share"], d["unvisited_share"]) == (pct(cells[2]), pct(cells[4]), pct(cells[5]))
    got = series(browser, "chart-coverage")
    assert got["x"] == list(range(1, 11))  # 20 steps: ten windows of two
    for k, d in enumerate(cov["domains"]):
        assert got["series"][d["domain"]] == pytest.approx([row[k] for row in cov["picks_by_window"]])
    assert browser.find_elements("css selector", "#chart-coverage canvas")
    # Its x is the window, not steps: the step zoom of the other charts leaves it whole.
    scale = "const u = document.getElementById(arguments[0]).uplot; return [u.scales.x.min, u.scales.x.max]"
    assert browser.execute_script(scale, "chart-rollouts") == [2, 5]
    assert browser.execute_script(scale, "chart-coverage") == [1, 10]
    assert "steps 0–1" in browser.find_element("id", "coverage-note").text
    assert_no_console_errors(browser)


def test_data_quality_view_lists_what_the_api_finds(live, browser):
    """The run page's data-quality table shows the endpoint's findings for the form's
    filters (at the endpoint's defaults first), and its download links carry the same filters."""
    from selenium.webdriver.support.ui import Select, WebDriverWait

    server, sim = live
    base = f"/v1/runs/{sim.run_id}/data-quality"
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0")
    want = api(server, base, limit=1000)["items"]
    assert want, "the simulated run has findings at the defaults"
    WebDriverWait(browser, 30).until(lambda d: d.find_element("id", "quality-counts").text != "")
    assert attrs(browser, "#quality tbody tr", "data-prompt") == [i["prompt_id"] for i in want]
    form = browser.find_element("id", "quality-filter")
    Select(form.find_element("name", "kind")).select_by_value("broken")
    conf = form.find_element("name", "min_confidence")
    conf.clear()
    conf.send_keys("0.2")
    form.find_element("css selector", "button[type=submit]").click()
    wide = api(server, base, kind="broken", min_confidence=0.2, limit=1000)["items"]
    assert wide, "the simulated run has wrong-label suspects at confidence 0.2"
    WebDriverWait(browser, 30).until(lambda d: attrs(d, "#quality tbody tr", "data-prompt") == [i["prompt_id"] for i in wide])
    assert set(attrs(browser, "#quality tbody tr", "data-kind")) == {"broken"}
    href = browser.find_element("id", "quality-csv").get_attribute("href")
    assert "format=csv" in href and "min_confidence=0.2" in href and "kind=broken" in href
    text = httpx.get(href, timeout=60).text
    assert {line.split(",")[0] for line in text.splitlines()[1:]} == {i["prompt_id"] for i in wide}
    assert_no_console_errors(browser)


def test_data_quality_filters_and_sort_live_in_the_url(live, browser):
    """The data-quality filters and the sort (a click on a header; again: the other order)
    are written to the URL, and a page opened on that URL shows the same table."""
    from selenium.webdriver.support.ui import Select, WebDriverWait

    server, sim = live
    base = f"/v1/runs/{sim.run_id}/data-quality"
    open_page(browser, server.url + f"/ui/runs/{sim.run_id}?refresh=0&dq_sort=rollouts&dq_order=asc")
    want = api(server, base, sort="rollouts", order="asc", limit=1000)["items"]
    WebDriverWait(browser, 30).until(lambda d: attrs(d, "#quality tbody tr", "data-prompt") == [i["prompt_id"] for i in want])
    th = browser.find_element("css selector", '#quality th:has(button[data-sort="rollouts"])')
    assert th.get_attribute("aria-sort") == "ascending"
    form = browser.find_element("id", "quality-filter")
    Select(form.find_element("name", "domain")).select_by_value("code")
    form.find_element("css selector", "button[type=submit]").click()
    WebDriverWait(browser, 30).until(lambda d: "dq_domain=code" in d.current_url)
    browser.find_element("css selector", '#quality button[data-sort="groups"]').click()
    by_groups = api(server, base, domain="code", sort="groups", order="desc", limit=1000)["items"]
    assert by_groups and {i["domain"] for i in by_groups} == {"code"}
    WebDriverWait(browser, 30).until(
        lambda d: attrs(d, "#quality tbody tr", "data-prompt") == [i["prompt_id"] for i in by_groups])
    assert "dq_sort=groups" in browser.current_url and "dq_order" not in browser.current_url  # desc: the default
    browser.find_element("css selector", '#quality button[data-sort="groups"]').click()  # again: ascending
    asc = api(server, base, domain="code", sort="groups", order="asc", limit=1000)["items"]
    WebDriverWait(browser, 30).until(lambda d: attrs(d, "#quality tbody tr", "data-prompt") == [i["prompt_id"] for i in asc])
    url = browser.current_url
    assert "dq_order=asc" in url
    groups = [int(c.text.replace(",", "")) for c in browser.find_elements("css selector", "#quality tbody tr td:nth-child(5)")]
    assert groups == sorted(groups)
    # The URL alone brings the same table back.
    open_page(browser, url)
    WebDriverWait(browser, 30).until(lambda d: attrs(d, "#quality tbody tr", "data-prompt") == [i["prompt_id"] for i in asc])
    assert Select(browser.find_element("css selector", "#quality-filter select[name=domain]")).first_selected_option.get_attribute("value") == "code"
    assert_no_console_errors(browser)


def test_data_quality_refreshes_while_live(live, browser):
    """New reports change the data-quality table without reloading the page: a prompt that
    fails every rollout where its domain's prompts pass half the time joins it."""
    from selenium.webdriver.support.ui import WebDriverWait

    server, _ = live
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.put("/v1/runs/dq-live", json={"strategy": {"name": "uniform"}}).status_code == 201
        prompts = [{"id": f"p{i}", "domain": "d"} for i in range(40)]
        assert c.post("/v1/runs/dq-live/prompts", json={"prompts": prompts}).status_code == 200
        body = {"report_id": "a", "step": 0, "results": [{"prompt_id": f"p{i}", "rewards": [1, 0] * 4} for i in range(39)]}
        assert c.post("/v1/runs/dq-live/results", json=body).status_code == 200
        open_page(browser, server.url + "/ui/runs/dq-live?refresh=1")
        assert attrs(browser, "#quality tbody tr", "data-prompt") == []  # one mixed group each: nothing to say
        body = {"report_id": "b", "step": 1, "results": [{"prompt_id": "p39", "rewards": [0] * 8}]}
        assert c.post("/v1/runs/dq-live/results", json=body).status_code == 200
        want = c.get("/v1/runs/dq-live/data-quality").json()["items"]
    assert [(i["prompt_id"], i["kind"]) for i in want] == [("p39", "broken")]
    WebDriverWait(browser, 60).until(lambda d: attrs(d, "#quality tbody tr", "data-prompt") == ["p39"])
    assert_no_console_errors(browser)
