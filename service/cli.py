"""``rollplan`` command line: serve, migrate."""

from __future__ import annotations

import os
import sys

try:
    import typer
except ImportError:  # the light client install has no CLI
    typer = None


def main() -> None:
    if typer is None:
        sys.exit("rollplan: the server is not installed; pip install 'rollplan[server]'")
    _app()()


def _app():
    app = typer.Typer(help="Rollplan: curriculum and rollout-budget scheduling for RL post-training.",
                      no_args_is_help=True, add_completion=False)

    @app.command()
    def serve(
        host: str = typer.Option("127.0.0.1", help="Interface to bind."),
        port: int = typer.Option(8321, help="Port to listen on."),
        database_url: str = typer.Option(None, help="SQLAlchemy URL (env ROLLPLAN_DATABASE_URL); "
                                         "default: SQLite file ./rollplan.db"),
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
        uvicorn.run("rollplan.service.app:create_app", factory=True, host=host, port=port,
                    workers=workers, log_level=log_level)

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
        which: str = typer.Argument(..., help="Which benchmark: learner (a real GRPO learner; needs torch), "
                                    "sim (a simulated learner at scale) or speed (plan latency, ingestion)."),
    ) -> None:
        """Run a benchmark; the remaining options go to it (e.g. --smoke, --out DIR)."""
        import importlib

        if which not in BENCHMARKS:
            raise typer.BadParameter(f"unknown benchmark {which!r}; known: {', '.join(BENCHMARKS)}", param_hint="WHICH")
        importlib.import_module(BENCHMARKS[which]).main(list(ctx.args))

    return app


# `rollplan bench NAME [options]` runs the module's main(argv); `--help` after NAME lists its options.
BENCHMARKS = {
    "learner": "rollplan.benchmarks.learner",
    "sim": "rollplan.benchmarks.sim",
    "speed": "rollplan.benchmarks.speed",
}


if __name__ == "__main__":
    main()
