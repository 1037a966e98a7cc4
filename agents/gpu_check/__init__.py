"""``python -m agents.gpu_check`` (``make gpu-check``): the agent's GPU edges checked on a real GPU.

Needs an NVIDIA driver (``libcuda.so.1``, NVML, ``nvidia-smi``; ``nvidia-cuda-mps-control``
for the MPS stage) and no CUDA toolkit. Stages, each reported as pass, fail or skip:

1. ``driver``: the CUDA driver API through ctypes (``agents.cuda_driver``) sees the GPU.
2. ``load``: a load generator, a process of its own, holds memory and keeps SMs busy with a
   PTX kernel the driver compiles.
3. ``nvml-vs-nvidia-smi``: what ``agents.backends.nvml`` reads for that PID beside what
   ``nvidia-smi`` prints, judged within the tolerances of ``agents.gpu_check.compare``.
4. ``mps``: a private MPS daemon with a pinned memory limit; the agent's mps enforcer drives
   it; a client under the limit runs, one over it gets ``CUDA_ERROR_OUT_OF_MEMORY``.
5. ``fixtures``: the NVML answers seen, saved for ``FakeNvml.from_fixture``.

The report is markdown on stdout (and ``--report FILE``). Exit 0: no stage failed; 1: a
stage failed; 3: nothing to check here (no driver, no ``nvidia-smi`` or no NVML), with the
reason on stderr.
"""

__all__: list[str] = []
