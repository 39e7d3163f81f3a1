"""``rollplan`` command line: serve, migrate, keys, bench."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

try:
    import typer

    HAVE_TYPER = True
except ImportError:  # the light client install has no CLI
    HAVE_TYPER = False


def main() -> None:
    if not HAVE_TYPER:
        sys.exit("rollplan: the server is not installed; pip install 'rollplan[server]'")
    argv = sys.argv[1:]
    if len(argv) >= 3 and argv[0] == "bench" and argv[1] in BENCHMARKS and ({"-h", "--help"} & set(argv[2:])):
        # `rollplan bench NAME --help`: NAME's own options, not the wrapper's.
        import importlib

        importlib.import_module(BENCHMARKS[argv[1]]).main(argv[2:])
        return
    _app()()


def _app():
    app = typer.Typer(
        help="Rollplan: curriculum and rollout-budget scheduling for RL post-training.",
        no_args_is_help=True,
        add_completion=False,
    )

    @app.command()
    def serve(
        host: str = typer.Option("127.0.0.1", help="Interface to bind."),
        port: int = typer.Option(8321, help="Port to listen on."),
        database_url: str = typer.Option(
            None, help="SQLAlchemy URL (env ROLLPLAN_DATABASE_URL); default: SQLite file ./rollplan.db"
        ),
        workers: int = typer.Option(1, help="Worker processes (use PostgreSQL for more than one)."),
        log_level: str = typer.Option("info"),
    ) -> None:
        """Create or upgrade the database, then serve the API."""
        import uvicorn

        from .config import Settings
        from .storage import migrate

        if database_url:
            os.environ["ROLLPLAN_DATABASE_URL"] = database_url
        settings = Settings()
        if workers > 1 and settings.is_sqlite:
            raise typer.BadParameter("several workers need PostgreSQL (ROLLPLAN_DATABASE_URL)", param_hint="--workers")
        if settings.auto_migrate:
            migrate.upgrade(settings.database_url)  # once, before workers start
        os.environ["ROLLPLAN_AUTO_MIGRATE"] = "false"
        uvicorn.run(
            "rollplan.service.app:create_app", factory=True, host=host, port=port, workers=workers, log_level=log_level
        )

    _add_migrate_and_bench(app)
    app.add_typer(_keys_app(), name="keys")
    return app


def _add_migrate_and_bench(app) -> None:
    @app.command("migrate")
    def migrate_cmd(
        revision: str = typer.Argument("head", help="Target revision (head, base, or an id)."),
        database_url: str = typer.Option(None, help="SQLAlchemy URL (env ROLLPLAN_DATABASE_URL)."),
        down: bool = typer.Option(False, "--down", help="Downgrade to the revision instead."),
    ) -> None:
        """Apply (or with --down, revert) schema migrations."""
        from .config import Settings
        from .storage import migrate

        url = database_url or Settings().database_url
        (migrate.downgrade if down else migrate.upgrade)(url, revision)
        typer.echo(f"database at revision {migrate.current(url)}")

    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def bench(
        ctx: typer.Context,
        which: str = typer.Argument(..., help="Which benchmark: " + ", ".join(BENCHMARKS) + "."),
    ) -> None:
        """Run a benchmark; the remaining options go to it (e.g. --smoke, --out DIR)."""
        import importlib

        if which not in BENCHMARKS:
            raise typer.BadParameter(f"unknown benchmark {which!r}; known: {', '.join(BENCHMARKS)}", param_hint="WHICH")
        importlib.import_module(BENCHMARKS[which]).main(list(ctx.args))


@contextmanager
def _key_session(database_url: str | None) -> Iterator[Session]:
    """A session on the key store (migrated first when the settings say so), its engine
    disposed after."""
    from .config import Settings
    from .storage import migrate
    from .storage.db import make_engine, make_sessionmaker

    settings = Settings(database_url=database_url) if database_url else Settings()
    if settings.auto_migrate:
        migrate.upgrade(settings.database_url)
    engine = make_engine(settings)
    try:
        with make_sessionmaker(engine)() as s:
            yield s
    finally:
        engine.dispose()


def _keys_app():
    keys = typer.Typer(help="Manage API keys (stored hashed in the database).", no_args_is_help=True)
    db_opt = typer.Option(None, "--database-url", help="SQLAlchemy URL (env ROLLPLAN_DATABASE_URL).")

    @keys.command("create")
    def create(
        scope: str = typer.Option(..., help="read, write or admin."),
        name: str = typer.Option(None, help="A label for people."),
        run: list[str] = typer.Option(None, "--run", help="Bind the key to this run id (repeatable)."),
        runs_prefix: str = typer.Option(None, help="Bind the key to runs whose id starts with this, e.g. 'team-a:'."),
        database_url: str = db_opt,
    ) -> None:
        """Create a key and print it once (only its hash is stored)."""
        from . import auth
        from .errors import RollplanError

        with _key_session(database_url) as s:
            try:
                row, key = auth.create_key(s, scope, name=name, run_ids=run or None, runs_prefix=runs_prefix)
            except RollplanError as e:
                raise typer.BadParameter(e.detail) from None
            s.commit()
        typer.echo(key)
        typer.echo(f"key id {row.key_id}, scope {row.scope}; store the key now, it is not shown again", err=True)

    @keys.command("list")
    def list_(
        database_url: str = db_opt,
        active: bool = typer.Option(False, "--active", help="Leave out revoked keys."),
    ) -> None:
        """List keys (ids, scopes, bindings; never the keys)."""
        from . import auth

        with _key_session(database_url) as s:
            rows = auth.list_keys(s, include_revoked=not active)
        typer.echo("key_id\tscope\trevoked\truns\tname")
        for r in rows:
            bound = ",".join(r.run_ids or []) + (f" {r.runs_prefix}*" if r.runs_prefix else "")
            typer.echo(
                f"{r.key_id}\t{r.scope}\t{'yes' if r.revoked_at else 'no'}\t{bound.strip() or '*'}\t{r.name or ''}"
            )

    @keys.command("revoke")
    def revoke(
        key_id: str = typer.Argument(..., help="The key id shown by create / list."), database_url: str = db_opt
    ) -> None:
        """Revoke a key; every replica refuses it from the next request."""
        from . import auth
        from .errors import NotFound

        with _key_session(database_url) as s:
            try:
                auth.revoke_key(s, key_id)
            except NotFound as e:
                typer.echo(e.detail, err=True)
                raise typer.Exit(1) from None
            s.commit()
        typer.echo(f"revoked {key_id}")

    return keys


# `rollplan bench NAME [options]` runs the module's main(argv); `--help` after NAME lists its options.
BENCHMARKS = {
    "learner": "rollplan.benchmarks.learner",
    "sim": "rollplan.benchmarks.sim",
    "speed": "rollplan.benchmarks.speed",
    "core": "rollplan.benchmarks.core",
    "load": "rollplan.benchmarks.load",
    "suite": "rollplan.benchmarks.suite",
    "fold": "rollplan.benchmarks.fold",
    "scale": "rollplan.benchmarks.scale",
    "quality": "rollplan.benchmarks.quality",
    "cost": "rollplan.benchmarks.cost",
    "transfer": "rollplan.benchmarks.transfer",
}


if __name__ == "__main__":
    main()
