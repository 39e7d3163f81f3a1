"""An embedded Rollplan server for a single-node run: no service to set up.

When a plugin is given no service URL (neither an argument nor ``$ROLLPLAN_URL``), the
main process of the node starts ``rollplan serve`` as a child process on a free local
port, with its SQLite database in the trainer's output directory
(``{output_dir}/rollplan/rollplan.db``), and hands its URL to the other ranks. The server
lives as long as the trainer process: it is stopped at exit, and it is killed by the
kernel if the trainer dies (``PR_SET_PDEATHSIG`` on Linux). A trainer resumed from a
checkpoint in the same output directory starts a server on the same database and so
reattaches to the same run, with its whole history.

The server needs the server extra in the trainer's environment (``pip install
'rollplan[server]'``); without it, :func:`start_embedded` says so.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["EmbeddedServer", "embedded_server", "resolve_url", "service_url", "start_embedded"]

logger = logging.getLogger("rollplan.plugins")

EMBEDDED = "embedded"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The child's first lines (after exec, so no preexec_fn, which is unsafe in a process with
# threads): on Linux ask for SIGTERM when the trainer dies, even by SIGKILL
# (PR_SET_PDEATHSIG), and exit if it is already gone; then run `rollplan serve`.
_BOOT = """
import os, sys
parent = int(sys.argv.pop(1))
if sys.platform.startswith("linux"):
    try:
        import ctypes, signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))
    except Exception:
        pass
    if os.getppid() != parent:
        sys.exit(0)
from rollplan.service.cli import main
sys.argv[0] = "rollplan"
main()
"""


class EmbeddedServer:
    """``rollplan serve`` in a child process, its database and log in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], *, port: int | None = None) -> None:
        self.directory = Path(directory)
        self.database = self.directory / "rollplan.db"
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    def start(self, timeout: float = 120.0) -> str:
        """Start the server and wait until it answers ``/healthz``; returns its URL."""
        if importlib.util.find_spec("rollplan.service") is None or importlib.util.find_spec("uvicorn") is None:
            raise RuntimeError(
                "no Rollplan service URL was given (argument or $ROLLPLAN_URL), and the embedded server "
                "needs the server extra in this environment: pip install 'rollplan[server]' — or pass the "
                "URL of a running service"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        port = self.port or _free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 - the child's stdout for its lifetime
        env = {**os.environ, "ROLLPLAN_DATABASE_URL": f"sqlite:///{self.database}"}
        cmd = [sys.executable, "-c", _BOOT, str(os.getpid()), "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--log-level", "warning"]
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the embedded Rollplan server exited with code {self.process.returncode}; "
                    f"see {self.directory / 'server.log'}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"the embedded Rollplan server did not answer within {timeout:.0f} s")
        (self.directory / "server.json").write_text(
            json.dumps({"url": self.url, "pid": self.process.pid, "database": str(self.database)}) + "\n"
        )
        logger.warning(
            "Rollplan: no service URL given; started an embedded server at %s (database %s, log %s)",
            self.url,
            self.database,
            self.directory / "server.log",
        )
        return self.url

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (uvicorn shuts down gracefully: every acknowledged report is committed)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_STARTED: dict[Path, EmbeddedServer] = {}


def embedded_server(directory: str | os.PathLike[str]) -> EmbeddedServer:
    """This process's embedded server for ``directory``: started the first time (or again
    once stopped), then shared — two plugin parts of one trainer (verl's dataset and replay
    buffer) reach the same one."""
    key = Path(directory).resolve()
    server = _STARTED.get(key)
    if server is None or not server.running:
        server = _STARTED[key] = EmbeddedServer(key)
        server.start()
    return server


def start_embedded(output_dir: str | os.PathLike[str]) -> EmbeddedServer:
    """The embedded server of a trainer's output directory (``{output_dir}/rollplan``)."""
    return embedded_server(Path(output_dir) / "rollplan")


def resolve_url(url: str | None) -> str | None:
    """The service URL to use: ``url``, else ``$ROLLPLAN_URL``; None (or ``"embedded"``)
    means "start an embedded server"."""
    url = url or os.environ.get("ROLLPLAN_URL") or None
    return None if url == EMBEDDED else url


def service_url(url: str | None, directory: str | os.PathLike[str]) -> str:
    """``url`` (or ``$ROLLPLAN_URL``); without one, the URL of :func:`embedded_server`."""
    resolved = resolve_url(url)
    if resolved is not None:
        return resolved
    server = embedded_server(directory)
    assert server.url is not None
    return server.url
