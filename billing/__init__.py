"""The control-plane Django app: ingest, ledger, pricing, reports, budgets and the web UI."""
