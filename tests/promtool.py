"""Debian's promtool (package `prometheus`), which `make test` installs (`make monitoring-deps`)."""

from __future__ import annotations

import shutil

import pytest


def promtool() -> str:
    """The promtool binary; a missing one fails the test (never skips it): the checks it runs are
    part of the suite."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: `make monitoring-deps` installs Debian's prometheus package "
                    "(apt-get install --no-install-recommends prometheus)")
    return path
