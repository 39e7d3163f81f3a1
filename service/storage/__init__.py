"""Every SQL statement of the service, and every dialect difference: ``models`` (the
tables), ``db`` (engines, sessions, the run's lock, bulk writes), ``repository`` (the
write and fold paths: runs, prompts, reports, plans, the event log), and one module per
other reader — ``inspection`` (the read-only views and the export), ``keys`` (API keys),
``metrics`` (Prometheus' per-run gauges), ``predictor`` (the learned predictor's
versions and training reads), ``run_metrics`` (a run's eval metrics); ``migrate`` runs
the Alembic migrations."""
