"""gunicorn settings for every way the web process starts (`make demo`, the image, Kubernetes):
`gunicorn config.wsgi -c config/gunicorn.conf.py ...`; workers, threads and the bind stay on the
command line.

It makes /metrics correct under several workers (billing/metrics.py). Each worker counts in its
own process, so prometheus_client's multiprocess mode keeps every worker's counts in a file under
PROMETHEUS_MULTIPROC_DIR and a scrape, served by any worker, sums them all:
- the variable is set here, in the master, before any worker imports prometheus_client (which
  reads it at import), so all workers inherit it; given from outside (Kubernetes mounts an
  emptyDir there) it is kept, else the master makes a private directory and removes it on exit;
- the master wipes the directory when it starts: files left by an earlier server would be added
  to this one's counts;
- `child_exit` marks a dead worker's gauges for removal (counters stay, so totals never go back).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

_MULTIPROC_VAR = "PROMETHEUS_MULTIPROC_DIR"
# Remembers which directory this master made, across a reload of this file (SIGHUP).
_OWN_VAR = "VGPU_GUNICORN_OWN_METRICS_DIR"
if not os.environ.get(_MULTIPROC_VAR):
    os.environ[_MULTIPROC_VAR] = os.environ[_OWN_VAR] = tempfile.mkdtemp(prefix="vgpu-ledger-metrics-")


def on_starting(server: Any) -> None:
    directory = Path(os.environ[_MULTIPROC_VAR])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess  # noqa: PLC0415 - loaded only in the master, when a worker exits

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    if os.environ.get(_OWN_VAR) == os.environ[_MULTIPROC_VAR]:
        shutil.rmtree(os.environ[_MULTIPROC_VAR], ignore_errors=True)
