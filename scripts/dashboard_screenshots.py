"""Screenshots of the dashboard for the README (docs/dashboard-*.png).

Starts `rollplan serve` on a temporary SQLite database, fills it with the
simulated run the browser tests use (tests/sim.py) and two more with other
strategies, and photographs the run page, one prompt page and the comparison of the three with headless Chromium (Selenium; Debian's chromium and
chromium-driver packages).

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ServerProcess  # noqa: E402
from sim import simulate  # noqa: E402
from test_dashboard_browser import make_driver  # noqa: E402


def wait_loaded(driver, timeout=60.0):
    deadline = time.monotonic() + timeout
    while int(driver.execute_script("return document.body.dataset.loaded || 0")) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("page did not load")
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "docs"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        server = ServerProcess(f"sqlite:///{d}/shots.db", Path(d)).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                sim = simulate(c, run_id="qwen-7b-grpo", n_prompts=300, steps=20, batch_size=32, seed=7)
                top = c.get(f"/v1/runs/{sim.run_id}/prompts", params={"sort": "rollouts", "order": "desc", "limit": 1}).json()
                others = [simulate(c, run_id=f"qwen-7b-{name}", strategy=name, n_prompts=300, steps=20, batch_size=32, seed=7)
                          for name in ("uniform", "beta")]
            driver = make_driver(Path(d) / "profile")
            try:
                driver.set_window_size(1280, 900)
                driver.get(f"{server.url}/ui/runs/{sim.run_id}?refresh=0")
                wait_loaded(driver)
                height = driver.execute_script("return document.body.scrollHeight")
                driver.set_window_size(1280, min(height + 120, 2500))
                driver.get(f"{server.url}/ui/runs/{sim.run_id}?refresh=0")  # redraw charts at the final width
                wait_loaded(driver)
                driver.save_screenshot(str(out / "dashboard-run.png"))
                pid = top["items"][0]["id"]
                driver.set_window_size(1280, 900)
                driver.get(f"{server.url}/ui/runs/{sim.run_id}/prompts/{quote(pid, safe='')}?refresh=0")
                wait_loaded(driver)
                height = driver.execute_script("return document.body.scrollHeight")
                driver.set_window_size(1280, min(height + 120, 2400))
                wait_loaded(driver)
                driver.save_screenshot(str(out / "dashboard-prompt.png"))
                ids = ",".join([sim.run_id] + [o.run_id for o in others])
                driver.set_window_size(1280, 900)
                driver.get(f"{server.url}/ui/compare?runs={ids}&refresh=0")
                wait_loaded(driver)
                height = driver.execute_script("return document.body.scrollHeight")
                driver.set_window_size(1280, min(height + 120, 2500))
                driver.get(f"{server.url}/ui/compare?runs={ids}&refresh=0")
                wait_loaded(driver)
                driver.save_screenshot(str(out / "dashboard-compare.png"))
            finally:
                driver.quit()
        finally:
            server.stop()
    print(f"wrote {out / 'dashboard-run.png'}, {out / 'dashboard-prompt.png'} and {out / 'dashboard-compare.png'}")


if __name__ == "__main__":
    main()
