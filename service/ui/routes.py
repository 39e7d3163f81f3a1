"""The dashboard: static pages served by the service itself under ``/ui``.

The pages are plain HTML and JavaScript in this package (``pages/``, ``static/``);
they read the JSON inspection API and draw with uPlot (vendored in ``static/``,
MIT licence in ``static/uPlot.LICENSE``) and a canvas heatmap. No CDN, no build
step. Pages poll the API while a run is live (``?refresh=SECONDS``, 0 to stop).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

_PKG = files("rollplan.service.ui")


def _page(name: str) -> HTMLResponse:
    return HTMLResponse(_PKG.joinpath("pages", name).read_text(encoding="utf-8"))


def mount(app: FastAPI) -> None:
    app.mount("/ui/static", StaticFiles(directory=str(_PKG.joinpath("static"))), name="ui-static")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/ui", include_in_schema=False)
    @app.get("/ui/", include_in_schema=False)
    def runs_page() -> HTMLResponse:
        return _page("runs.html")

    @app.get("/ui/compare", include_in_schema=False)
    def compare_page() -> HTMLResponse:
        """Runs side by side: ``/ui/compare?runs=a,b,c`` (the page reads the query)."""
        return _page("compare.html")

    @app.get("/ui/runs/{run_id}", include_in_schema=False)
    def run_page(run_id: str) -> HTMLResponse:
        return _page("run.html")

    @app.get("/ui/runs/{run_id}/prompts/{prompt_id:path}", include_in_schema=False)
    def prompt_page(run_id: str, prompt_id: str) -> HTMLResponse:
        return _page("prompt.html")
