"""Shared fixtures: every API test runs on SQLite (the embedded default) and on
the real PostgreSQL.

PostgreSQL: ``ROLLPLAN_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``); each test gets a database of
its own, created from it and dropped after. When the server cannot be reached
the PostgreSQL variants are skipped — unless ``ROLLPLAN_REQUIRE_POSTGRES=1``
(as in CI), where they fail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

PG_ADMIN_URL = os.environ.get("ROLLPLAN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REQUIRE_PG = os.environ.get("ROLLPLAN_REQUIRE_POSTGRES", "") not in ("", "0", "false")


def _pg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _pg_available() -> str | None:
    try:
        import psycopg

        with psycopg.connect(_pg_dsn(PG_ADMIN_URL), connect_timeout=3):
            return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


_PG_ERROR = _pg_available()


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    if _PG_ERROR is not None:
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL is required (ROLLPLAN_REQUIRE_POSTGRES=1) but unreachable: {_PG_ERROR}")
        pytest.skip(f"PostgreSQL unreachable: {_PG_ERROR}")
    return PG_ADMIN_URL


def _new_pg_database(admin_url: str) -> tuple[str, callable]:
    import psycopg

    name = f"rollplan_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_pg_dsn(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = _pg_dsn(admin_url).rsplit("/", 1)[0]
    url = f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://")

    def drop() -> None:
        with psycopg.connect(_pg_dsn(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url, drop


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty database URL of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'rollplan.db'}"
        return
    admin = request.getfixturevalue("pg_admin_url")
    url, drop = _new_pg_database(admin)
    try:
        yield url
    finally:
        drop()


@pytest.fixture
def make_settings(db_url):
    from rollplan.service.config import Settings

    def make(**overrides) -> Settings:
        return Settings(database_url=db_url, **overrides)

    return make


@pytest.fixture
def make_client(make_settings):
    """Start an app in-process (lifespan included) with the given settings overrides."""
    from fastapi.testclient import TestClient

    from rollplan.service.app import create_app

    clients = []

    def make(**overrides) -> TestClient:
        c = TestClient(create_app(make_settings(**overrides)))
        c.__enter__()
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client):
    return make_client()


# -- real server processes ----------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``rollplan serve`` in a subprocess; start, SIGKILL, restart."""

    def __init__(self, database_url: str, workdir: Path, env: dict | None = None, port: int | None = None,
                 args: list[str] | None = None):
        self.database_url = database_url
        self.workdir = workdir
        self.env = env or {}
        self.args = args or []  # extra `rollplan serve` options, e.g. ["--workers", "2"]
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        env = {**os.environ, "ROLLPLAN_DATABASE_URL": self.database_url, **self.env}
        self.log = open(self.workdir / f"server-{self.port}-{time.time_ns()}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollplan.service.cli", "serve", "--port", str(self.port), "--log-level", "warning",
             *self.args],
            env=env,
            cwd=self.workdir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.read_log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become ready: {self.read_log()}")

    def read_log(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def server_factory(db_url, tmp_path):
    servers: list[ServerProcess] = []

    def make(**kw) -> ServerProcess:
        s = ServerProcess(kw.pop("database_url", db_url), tmp_path, **kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()
