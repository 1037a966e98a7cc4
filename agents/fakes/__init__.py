"""Fakes for the agent's edges, shipped with the code (docs/design.md, House rules).

One module per edge, named after the module that talks to the real thing:

- ``clock``: ``agents.clock`` (a clock that moves only when slept on);
- ``nvml``: ``agents.backends.nvml`` (pynvml over in-memory devices, NVML fixtures);
- ``kube``: ``agents.kube`` and the other Kubernetes client code (an API server on loopback);
- ``mps``: ``agents.mps`` (an MPS control daemon over real pipes, and its front end:
  ``python -m agents.fakes.mps``);
- ``cuda_driver``: ``agents.cuda_driver`` (``libcuda.so.1`` as ctypes callbacks);
- ``service``: the ledger service's HTTP API as ``agents.uploader`` and ``agents.events`` post to it.

The agent itself uses ``clock`` at run time (``run --once-seconds``) and ``python -m
agents.gpu_check`` writes its NVML fixtures through ``nvml``; the rest serve the tests.
"""
