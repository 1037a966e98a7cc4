"""The ledger's reads hand back frozen rows matched to the statement's columns by name
(billing.ledger.reads.fetch_rows), never read by position."""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

import pytest
from django.db import connection

from billing.ledger.reads import fetch_rows, no_cycle_collection


@dataclass(frozen=True)
class _Pair:
    a: int
    b: str


@pytest.mark.django_db
def test_rows_are_matched_to_fields_by_column_name_whatever_the_column_order() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT 'x' AS b, 1 AS a UNION ALL SELECT 'y', 2 ORDER BY 2")
        rows = fetch_rows(cur, _Pair)
    assert rows == [_Pair(a=1, b="x"), _Pair(a=2, b="y")]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows[0].a = 3  # type: ignore[misc]  # the point: rows are frozen


@pytest.mark.django_db
@pytest.mark.parametrize("sql", ["SELECT 1 AS a", "SELECT 1 AS a, 'x' AS b, 2 AS c", "SELECT 1 AS a, 'x' AS z"])
def test_a_statement_whose_columns_are_not_the_rows_fields_is_an_error(sql: str) -> None:
    with connection.cursor() as cur:
        cur.execute(sql)
        with pytest.raises(TypeError):
            fetch_rows(cur, _Pair)



def test_the_cycle_collector_is_paused_inside_a_read_and_resumed_after_it_even_when_it_fails() -> None:
    assert gc.isenabled()
    with no_cycle_collection():
        assert not gc.isenabled()
        with no_cycle_collection():  # nested: the inner one does not resume it
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError, match="boom"), no_cycle_collection():
        raise ValueError("boom")
    assert gc.isenabled()


def test_a_collector_paused_by_someone_else_stays_paused() -> None:
    gc.disable()
    try:
        with no_cycle_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
