"""/docs (Swagger UI) and /redoc (ReDoc) with the network cut off: every asset comes
from the service itself (vendored in service/ui/static/apidocs/ with their licences),
nothing from a CDN, not even a favicon or a font.

The page checks drive a real headless Chromium (as tests/test_dashboard_browser.py
does, and skipped or failed the same way: ROLLPLAN_REQUIRE_BROWSER) against a real
``rollplan serve``. Everything but the loopback address is cut off: host names do not
resolve, and any other address goes to a proxy that is not there; the performance log
then shows that no request left 127.0.0.1.
"""

from __future__ import annotations

import fnmatch
import json
import re
from importlib.resources import files
from pathlib import Path

import pytest
from conftest import ServerProcess
from test_dashboard_browser import CHROME_FLAGS, CHROMEDRIVER, CHROMIUM, MISSING, REQUIRE, assert_no_console_errors

from rollplan.service.app import create_app
from rollplan.service.config import Settings

ROOT = Path(__file__).resolve().parent.parent
ASSETS = files("rollplan.service.ui").joinpath("static", "apidocs")
BROWSER = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None and not REQUIRE, reason=f"browser tests need Chromium: {MISSING}"),
]


def browser_test(fn):
    for mark in BROWSER:
        fn = mark(fn)
    return fn


OFFLINE_FLAGS = [
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",  # a closed port: every non-loopback address fails
]


# -- without a browser --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from fastapi.testclient import TestClient

    db = tmp_path_factory.mktemp("docs") / "docs.db"
    with TestClient(create_app(Settings(database_url=f"sqlite:///{db}"))) as c:
        yield c


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_pages_name_only_local_assets(client, page):
    html = client.get(page).text
    assert "://" not in html and "//cdn" not in html, html  # no absolute URL of any kind
    refs = [a or b for a, b in re.findall(r'(?:src|href|spec-url)="([^"]*)"|\burl: \'([^\']*)\'', html)]
    assert refs and all(r.startswith("/") for r in refs), refs
    for ref in refs:
        r = client.get(ref)
        assert r.status_code == 200 and r.content, ref


def test_swagger_ui_settings(client):
    html = client.get("/docs").text
    assert '"validatorUrl": null' in html  # no badge image from the public validator
    assert client.get("/docs/oauth2-redirect").status_code == 200


def test_assets_and_licences_ship_in_the_wheel():
    names = {p.name for p in ASSETS.iterdir()}
    want = {"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "redoc.standalone.js"}
    assert want <= names
    # Each bundle with its licence (Apache-2.0 and its NOTICE; MIT) and its third-party notices.
    assert {"swagger-ui.LICENSE", "swagger-ui.NOTICE", "redoc.LICENSE"} <= names
    assert {"swagger-ui-bundle.js.LICENSE.txt", "redoc.standalone.js.LICENSE.txt"} <= names
    assert "Apache License" in ASSETS.joinpath("swagger-ui.LICENSE").read_text()
    assert "MIT License" in ASSETS.joinpath("redoc.LICENSE").read_text()
    # package-data lists them, so an installed wheel has them too.
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data["rollplan.service.ui.static.apidocs"]
    for name in names:
        assert any(fnmatch.fnmatch(name, p) for p in patterns), name
    assert "rollplan.service.ui.static.apidocs" in (ROOT / "pyproject.toml").read_text().split("packages = [")[1]


def test_openapi_document_by_auth_mode(tmp_path):
    from fastapi.testclient import TestClient

    op = ("/v1/runs/{run_id}", "get")
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}"))) as c:
        keyless = c.get("/openapi.json").json()
        assert keyless["paths"][op[0]][op[1]]["security"] == [{}, {"HTTPBearer": []}]
        assert "security" not in keyless["paths"]["/healthz"]["get"]
        made = c.post("/v1/keys", json={"scope": "admin"})  # the first key turns auth on
        assert made.status_code == 201
        keyed = c.get("/openapi.json").json()
        assert keyed["paths"][op[0]][op[1]]["security"] == [{"HTTPBearer": []}]
        assert c.get("/v1/runs").status_code == 401


def test_405_allows_every_method_of_the_path(client):
    for path, allow in [
        ("/v1/runs/r", "GET, PUT"),
        ("/v1/runs/r/prompts", "GET, POST"),
        ("/v1/keys", "GET, POST"),
        ("/healthz", "GET"),
    ]:
        r = client.request("OPTIONS", path)
        assert r.status_code == 405 and r.headers["allow"] == allow, (path, r.headers)
        assert r.headers["content-type"] == "application/problem+json"


# -- in Chromium, offline ---------------------------------------------------------------------
def offline_driver(profile_dir):
    if MISSING is not None:
        pytest.fail(f"ROLLPLAN_REQUIRE_BROWSER is set but {MISSING}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*CHROME_FLAGS, *OFFLINE_FLAGS]:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile_dir}")
    opts.add_argument("--window-size=1400,1000")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    d = tmp_path_factory.mktemp("docs-live")
    server = ServerProcess(f"sqlite:///{d / 'docs.db'}", d).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = offline_driver(tmp_path_factory.mktemp("chromium-profile"))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def requests_made(driver) -> tuple[list[str], list[str]]:
    """The URLs the page asked for and those that failed, from the performance log."""
    sent, failed, urls = [], [], {}
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        params = msg.get("params", {})
        if msg["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
            sent.append(params["request"]["url"])
        elif msg["method"] == "Network.loadingFailed" and not params.get("canceled"):
            # Only this page's requests: one the browser's start page made before (its
            # new-tab page asks the web for things) can fail after the log was read.
            if params["requestId"] in urls:
                failed.append(f"{urls[params['requestId']]}: {params.get('errorText')}")
    return sent, failed


def open_offline(driver, url, rendered_js):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get_log("browser")  # drop entries of earlier pages
    driver.get_log("performance")
    driver.get(url)
    WebDriverWait(driver, 60).until(lambda d: d.execute_script(rendered_js))


def assert_all_local(driver, server):
    """Every network request of the page went to the server (the browser's own
    chrome:// pages, data: and blob: URLs are not network requests)."""
    sent, failed = requests_made(driver)
    network = [u for u in sent if re.match(r"(https?|wss?|ftp):", u)]
    assert any(u.startswith(server.url + "/openapi.json") for u in network), sent
    assert all(u.startswith(server.url + "/") for u in network), [u for u in network if not u.startswith(server.url)]
    assert not failed, failed


SWAGGER_RENDERED = (
    "return document.querySelectorAll('.opblock').length > 0 && "
    "!!document.querySelector('.opblock-summary-path[data-path=\"/v1/runs/{run_id}\"]')"
)
REDOC_RENDERED = (
    "return !!document.querySelector('.api-content') && "
    "document.body.innerText.includes('/v1/runs/{run_id}') && "
    "document.querySelectorAll('[data-section-id^=\"operation/\"]').length > 0"
)


@browser_test
def test_swagger_ui_renders_offline(live, browser):
    open_offline(browser, live.url + "/docs", SWAGGER_RENDERED)
    paths = browser.execute_script(
        "return Array.from(document.querySelectorAll('.opblock-summary-path'), e => e.dataset.path)"
    )
    methods = browser.execute_script(
        "return Array.from(document.querySelectorAll('.opblock-summary-method'), e => e.textContent)"
    )
    assert {"/v1/runs/{run_id}", "/v1/runs/{run_id}/plans", "/v1/runs/{run_id}/results", "/v1/keys"} <= set(paths)
    assert {"GET", "PUT", "POST", "DELETE"} <= set(methods)
    assert_all_local(browser, live)
    assert_no_console_errors(browser)


@browser_test
def test_redoc_renders_offline(live, browser):
    open_offline(browser, live.url + "/redoc", REDOC_RENDERED)
    ops = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-section-id^=\"operation/\"]'), e => e.dataset.sectionId)"
    )
    assert len(ops) >= 20, ops
    assert_all_local(browser, live)
    assert_no_console_errors(browser)
