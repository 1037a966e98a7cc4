"""The ledger: the one owner of every ledger table.

Raw samples (day-partitioned, billing.ledger.partitions), accepted batches and their GPUs
(billing.ledger.batches), and the priced minute, hour and day ledgers derived from them
(billing.ledger.rollup). Every read and write of those tables goes through this package;
the rest of billing calls its functions and gets frozen, typed rows back. An import-linter
contract (pyproject.toml) and tests/test_layering.py keep it that way.

This module imports nothing, so `billing.models` can register the ledger's models without a
cycle.
"""
