"""vGPU Ledger node agent: measure, grant, enforce, meter, spool, upload.

Imports ``allocator`` only; never Django, ``billing`` or ``config`` (the agent
runs on GPU nodes without the service's dependencies).
"""

__all__: list[str] = []
