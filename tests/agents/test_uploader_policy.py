"""Retry decisions of the uploader, as pure functions (no network)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from agents.uploader import Outcome, RetryPolicy, Uploader, backoff_delay, classify_status, parse_retry_after

NOW = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (201, Outcome.SENT),
        (200, Outcome.SENT),
        (400, Outcome.DEAD),
        (409, Outcome.DEAD),
        (413, Outcome.DEAD),
        (415, Outcome.DEAD),
        (401, Outcome.AUTH),
        (403, Outcome.AUTH),
        (429, Outcome.THROTTLED),
        (503, Outcome.THROTTLED),
        (500, Outcome.RETRY),
        (502, Outcome.RETRY),
        (504, Outcome.RETRY),
        (404, Outcome.RETRY),
    ],
)
def test_each_answer_of_the_service_maps_to_one_retry_decision(status: int, outcome: Outcome) -> None:
    assert classify_status(status) is outcome


def test_backoff_ceiling_doubles_per_attempt_up_to_the_cap() -> None:
    class Ceiling(random.Random):
        """Returns the top of the jitter range, exposing the ceiling."""

        def uniform(self, a: float, b: float) -> float:
            return b

    ceilings = [backoff_delay(attempt=n, base_s=1.0, cap_s=60.0, rng=Ceiling()) for n in range(9)]
    assert ceilings == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert backoff_delay(attempt=10_000, base_s=1.0, cap_s=60.0, rng=Ceiling()) == 60.0


def test_backoff_uses_full_jitter_and_is_reproducible_with_a_seed() -> None:
    first = [backoff_delay(attempt=n, base_s=0.5, cap_s=30.0, rng=random.Random(7)) for n in range(20)]
    again = [backoff_delay(attempt=n, base_s=0.5, cap_s=30.0, rng=random.Random(7)) for n in range(20)]
    assert first == again
    for n, delay in enumerate(first):
        assert 0.0 <= delay <= min(30.0, 0.5 * 2**n)


def test_negative_attempts_are_refused() -> None:
    with pytest.raises(ValueError, match="attempt must be >= 0"):
        backoff_delay(attempt=-1, base_s=1.0, cap_s=60.0, rng=random.Random(1))


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        (" 0 ", 0.0),
        ("Mon, 30 Nov 2026 03:00:45 GMT", 45.0),
        ("Mon, 30 Nov 2026 02:59:00 GMT", 0.0),  # a date in the past: retry now
        (None, None),
        ("soon", None),
        ("-5", None),
        ("1.5", None),
    ],
)
def test_retry_after_accepts_delta_seconds_and_http_dates(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, now=NOW) == seconds


def test_retry_policy_rejects_non_positive_settings() -> None:
    with pytest.raises(ValueError, match="cap_s must be > 0"):
        RetryPolicy(cap_s=0)


def test_uploader_posts_to_the_batches_endpoint_of_the_server(tmp_path: object) -> None:
    from pathlib import Path

    from agents.spool import Spool

    assert isinstance(tmp_path, Path)
    spool = Spool(tmp_path / "s.sqlite", node="n", now=lambda: NOW)
    uploader = Uploader(spool=spool, server="http://ledger:8000/", token=lambda: "t")
    assert uploader.url == "http://ledger:8000/api/v1/usage/batches"
    assert uploader.send_next() is None  # nothing pending: no request is made
