"""Attribution of GPU processes to workloads."""

from __future__ import annotations

from agents.interfaces import Workload

__all__ = ["UNATTRIBUTED", "PidAttributor"]

UNATTRIBUTED = "unattributed"


class PidAttributor:
    """``Attributor`` that knows only the pid: each process is its own pseudo-pod.

    Samples land on tenant and namespace ``unattributed`` with pod ``pid-<pid>``
    until pid -> cgroup -> pod attribution is wired in.
    """

    def attribute(self, *, pid: int) -> Workload:
        return Workload(
            tenant=UNATTRIBUTED,
            namespace=UNATTRIBUTED,
            pod=f"pid-{pid}",
            container="process",
            pod_uid=f"pid-{pid}",
            sla_tier="best-effort",
        )
