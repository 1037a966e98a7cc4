"""The CUDA driver API through ``ctypes`` (``libcuda.so.1``): enough to load a GPU on purpose.

Used by ``python -m agents.gpu_check load``, a compute process with its own PID that holds
device memory and keeps SMs busy, so that what NVML, ``nvidia-smi`` and MPS say about it can
be checked. Only the driver is needed: the kernel is hand-written PTX (``BUSY_PTX``) that the
driver's JIT compiles for whatever GPU it finds, so no CUDA toolkit, compiler or runtime
library is involved.

Every function used is declared in ``SIGNATURES`` (restype and argtypes), so ctypes never
guesses an argument's width; every ``CUresult`` other than ``CUDA_SUCCESS`` becomes a
``CudaError`` carrying the driver's own name and text for it (``cuGetErrorName`` /
``cuGetErrorString``), e.g. ``CUDA_ERROR_OUT_OF_MEMORY: out of memory``.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUSY_KERNEL",
    "BUSY_PTX",
    "BUSY_PTX_TARGET",
    "BUSY_PTX_VERSION",
    "DEFAULT_LIBRARY",
    "SIGNATURES",
    "CudaDevice",
    "CudaDriver",
    "CudaError",
    "CudaUnavailable",
    "LoadResult",
    "format_uuid",
]

DEFAULT_LIBRARY = "libcuda.so.1"  # the driver's soname; installed by the driver, not the toolkit

CUDA_SUCCESS = 0
# CUdevice_attribute values (cuda.h).
_ATTR_MULTIPROCESSOR_COUNT = 16
_ATTR_COMPUTE_CAPABILITY_MAJOR = 75
_ATTR_COMPUTE_CAPABILITY_MINOR = 76
# CUjit_option values (cuda.h): where the JIT writes why PTX was refused.
_JIT_ERROR_LOG_BUFFER = 5
_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
_JIT_LOG_BYTES = 8192

_MIB = 1024 * 1024
_THREADS_PER_BLOCK = 128  # four warps: one per scheduler of a current SM
# One kernel launch spins this long; the host relaunches until the run's duration is over, so a
# run of any length never meets a kernel watchdog and stops within a slice of being asked to.
_SLICE_NS = 200_000_000

_p = ctypes.c_void_p
_i = ctypes.c_int
_u = ctypes.c_uint
_sz = ctypes.c_size_t
_u64 = ctypes.c_uint64
_pp = ctypes.POINTER(ctypes.c_void_p)
_pi = ctypes.POINTER(ctypes.c_int)
_pchar = ctypes.POINTER(ctypes.c_char_p)

# name -> argtypes; every one returns CUresult (an int). CUdevice is an int, CUdeviceptr a
# 64-bit integer, contexts, modules, functions and streams are opaque pointers.
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuGetErrorName": (_i, _pchar),
    "cuGetErrorString": (_i, _pchar),
    "cuInit": (_u,),
    "cuDriverGetVersion": (_pi,),
    "cuDeviceGetCount": (_pi,),
    "cuDeviceGet": (_pi, _i),
    "cuDeviceGetName": (ctypes.c_char_p, _i, _i),
    "cuDeviceGetAttribute": (_pi, _i, _i),
    "cuDeviceTotalMem_v2": (ctypes.POINTER(_sz), _i),
    "cuDeviceGetUuid": (ctypes.c_char_p, _i),  # CUuuid: 16 bytes
    "cuDevicePrimaryCtxRetain": (_pp, _i),
    "cuDevicePrimaryCtxRelease_v2": (_i,),
    "cuCtxSetCurrent": (_p,),
    "cuCtxSynchronize": (),
    "cuMemAlloc_v2": (ctypes.POINTER(_u64), _sz),
    "cuMemsetD8_v2": (_u64, ctypes.c_ubyte, _sz),
    "cuMemcpyDtoH_v2": (_p, _u64, _sz),
    "cuMemFree_v2": (_u64,),
    "cuModuleLoadDataEx": (_pp, ctypes.c_char_p, _u, _pi, _pp),
    "cuModuleGetFunction": (_pp, _p, ctypes.c_char_p),
    "cuModuleUnload": (_p,),
    "cuLaunchKernel": (_p, _u, _u, _u, _u, _u, _u, _u, _p, _pp, _pp),
}

BUSY_KERNEL = "vgl_busy"
BUSY_PTX_VERSION = "6.0"  # PTX ISA of CUDA 9.0: every driver since then JITs it
BUSY_PTX_TARGET = "sm_52"  # the JIT compiles it for the actual GPU (any newer architecture)
# vgl_busy(u64 *iterations, u64 duration_ns): each thread spins on %globaltimer (nanoseconds,
# the same clock on every SM, so no clock-rate conversion) until duration_ns have passed;
# thread 0 of block b stores its loop count in iterations[b], which shows the kernel ran on
# every block. Launched with one block per SM wanted.
BUSY_PTX = f"""\
.version {BUSY_PTX_VERSION}
.target {BUSY_PTX_TARGET}
.address_size 64

.visible .entry {BUSY_KERNEL}(
    .param .u64 {BUSY_KERNEL}_param_0,
    .param .u64 {BUSY_KERNEL}_param_1
)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [{BUSY_KERNEL}_param_0];
    ld.param.u64 %rd2, [{BUSY_KERNEL}_param_1];
    mov.u64 %rd3, %globaltimer;
    add.u64 %rd4, %rd3, %rd2;
    mov.u64 %rd5, 0;
SPIN:
    add.u64 %rd5, %rd5, 1;
    mov.u64 %rd6, %globaltimer;
    setp.lt.u64 %p1, %rd6, %rd4;
    @%p1 bra SPIN;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra DONE;
    cvta.to.global.u64 %rd7, %rd1;
    mov.u32 %r2, %ctaid.x;
    mul.wide.u32 %rd8, %r2, 8;
    add.u64 %rd9, %rd7, %rd8;
    st.global.u64 [%rd9], %rd5;
DONE:
    ret;
}}
"""


class CudaUnavailable(RuntimeError):
    """There is no CUDA driver to load (no ``libcuda.so.1``, or a symbol this module needs is missing)."""


class CudaError(RuntimeError):
    """A driver call returned an error; ``name`` is the driver's (``CUDA_ERROR_OUT_OF_MEMORY``)."""

    def __init__(self, *, call: str, code: int, name: str, text: str) -> None:
        super().__init__(f"{call} failed: {name}: {text}")
        self.call = call
        self.code = code
        self.name = name
        self.text = text


@dataclass(frozen=True, slots=True)
class CudaDevice:
    ordinal: int  # CUDA's ordinal (after CUDA_VISIBLE_DEVICES), not NVML's index
    uuid: str  # "GPU-…", as NVML and nvidia-smi print it
    name: str
    sm_count: int
    compute_capability: tuple[int, int]
    memory_mb: int  # total, MiB


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one load run did: its allocation, its launches and the loop counts of its blocks."""

    allocated_mb: int
    blocks: int
    launches: int
    seconds: float
    min_block_iterations: int  # 0 would mean a block never ran


def format_uuid(raw: bytes) -> str:
    """A ``CUuuid``'s 16 bytes as NVML writes the same GPU: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    if len(raw) != 16:
        raise ValueError(f"a CUDA UUID has 16 bytes, got {len(raw)}")
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class CudaDriver:
    """``libcuda.so.1`` with every function used declared; calls raise ``CudaError``."""

    def __init__(self, library: str = DEFAULT_LIBRARY, *, loader: Callable[[str], Any] = ctypes.CDLL) -> None:
        try:
            self._lib = loader(library)
        except OSError as error:
            raise CudaUnavailable(f"cannot load {library} ({error}): no NVIDIA driver on this machine?") from None
        self.functions: dict[str, Any] = {}
        for name, argtypes in SIGNATURES.items():
            try:
                function = getattr(self._lib, name)
            except AttributeError:
                raise CudaUnavailable(f"{library} has no {name}: the driver is older than CUDA 11.0") from None
            function.restype = ctypes.c_int
            function.argtypes = list(argtypes)
            self.functions[name] = function

    def call(self, name: str, *args: Any) -> None:
        code = int(self.functions[name](*args))
        if code != CUDA_SUCCESS:
            raise CudaError(call=name, code=code, name=self._error_name(code), text=self._error_text(code))

    def _error_name(self, code: int) -> str:
        out = ctypes.c_char_p()
        if self.functions["cuGetErrorName"](code, ctypes.byref(out)) != CUDA_SUCCESS or not out.value:
            return f"CUresult {code}"  # a code this driver has no name for
        return out.value.decode()

    def _error_text(self, code: int) -> str:
        out = ctypes.c_char_p()
        if self.functions["cuGetErrorString"](code, ctypes.byref(out)) != CUDA_SUCCESS or not out.value:
            return "unknown error"
        return out.value.decode()

    # -- queries --------------------------------------------------------------------------------

    def init(self) -> None:
        self.call("cuInit", 0)

    def driver_version(self) -> str:
        """The CUDA version the driver supports, e.g. ``12.4``."""
        version = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(version))
        return f"{version.value // 1000}.{version.value % 1000 // 10}"

    def device_count(self) -> int:
        count = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def device(self, ordinal: int) -> CudaDevice:
        handle = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(handle), ordinal)
        dev = handle.value
        name = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", name, len(name), dev)
        uuid = ctypes.create_string_buffer(16)
        self.call("cuDeviceGetUuid", uuid, dev)
        total = ctypes.c_size_t()
        self.call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)
        return CudaDevice(
            ordinal=ordinal,
            uuid=format_uuid(uuid.raw),
            name=name.value.decode(),
            sm_count=self._attribute(_ATTR_MULTIPROCESSOR_COUNT, dev),
            compute_capability=(
                self._attribute(_ATTR_COMPUTE_CAPABILITY_MAJOR, dev),
                self._attribute(_ATTR_COMPUTE_CAPABILITY_MINOR, dev),
            ),
            memory_mb=total.value // _MIB,
        )

    def _attribute(self, attribute: int, dev: int) -> int:
        value = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(value), attribute, dev)
        return value.value

    # -- the load -------------------------------------------------------------------------------

    def run_load(
        self,
        *,
        ordinal: int,
        mb: int,
        blocks: int,
        seconds: float,
        on_ready: Callable[[], None] = lambda: None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> LoadResult:
        """Hold ``mb`` MiB (written, so it is resident) and spin ``blocks`` blocks for ``seconds``.

        ``on_ready`` runs once the memory is held and the first kernel is queued: from then on
        the process is what NVML and ``nvidia-smi`` should see. ``should_stop`` is asked after
        each kernel slice and ends the run early. Everything is freed on the way out.
        """
        if mb < 0 or blocks < 1 or seconds <= 0:
            raise ValueError(f"need mb >= 0, blocks >= 1, seconds > 0 (got {mb}, {blocks}, {seconds})")
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        context = ctypes.c_void_p()
        # The primary context: what CUDA runtime programs use, and what MPS clients connect with.
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), dev.value)
        try:
            self.call("cuCtxSetCurrent", context)
            return self._load_in_context(mb=mb, blocks=blocks, seconds=seconds, on_ready=on_ready, should_stop=should_stop)
        finally:
            self.call("cuDevicePrimaryCtxRelease_v2", dev.value)

    def _load_in_context(
        self, *, mb: int, blocks: int, seconds: float, on_ready: Callable[[], None], should_stop: Callable[[], bool]
    ) -> LoadResult:
        held = _u64(0)
        if mb:
            self.call("cuMemAlloc_v2", ctypes.byref(held), mb * _MIB)
        counters = _u64(0)
        module = ctypes.c_void_p()
        try:
            if mb:
                self.call("cuMemsetD8_v2", held, 0xA5, mb * _MIB)  # touch every page
            self.call("cuMemAlloc_v2", ctypes.byref(counters), blocks * 8)
            self.call("cuMemsetD8_v2", counters, 0, blocks * 8)
            self._load_module(module)
            kernel = ctypes.c_void_p()
            self.call("cuModuleGetFunction", ctypes.byref(kernel), module, BUSY_KERNEL.encode())
            launches, started = 0, time.monotonic()
            while True:
                remaining = seconds - (time.monotonic() - started)
                self._launch(kernel, blocks=blocks, counters=counters, ns=min(_SLICE_NS, max(1, int(remaining * 1e9))))
                launches += 1
                if launches == 1:
                    on_ready()
                self.call("cuCtxSynchronize")
                if time.monotonic() - started >= seconds or should_stop():
                    break
            return LoadResult(
                allocated_mb=mb,
                blocks=blocks,
                launches=launches,
                seconds=round(time.monotonic() - started, 3),
                min_block_iterations=min(self._read_counters(counters, blocks)),
            )
        finally:
            if module.value:
                self.call("cuModuleUnload", module)
            for pointer in (counters, held):
                if pointer.value:
                    self.call("cuMemFree_v2", pointer)

    def _load_module(self, module: ctypes.c_void_p) -> None:
        """JIT ``BUSY_PTX``; a refusal carries the JIT's own log in its message."""
        log = ctypes.create_string_buffer(_JIT_LOG_BYTES)
        options = (ctypes.c_int * 2)(_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(_JIT_LOG_BYTES))
        try:
            self.call("cuModuleLoadDataEx", ctypes.byref(module), BUSY_PTX.encode() + b"\0", 2, options, values)
        except CudaError as error:
            said = log.value.decode(errors="replace").strip()
            raise CudaError(call=error.call, code=error.code, name=error.name, text=f"{error.text}; JIT: {said}") from None

    def _launch(self, kernel: ctypes.c_void_p, *, blocks: int, counters: ctypes.c_uint64, ns: int) -> None:
        out, duration = _u64(counters.value), _u64(ns)
        params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
                                       ctypes.cast(ctypes.byref(duration), ctypes.c_void_p))
        self.call("cuLaunchKernel", kernel, blocks, 1, 1, _THREADS_PER_BLOCK, 1, 1, 0, None, params, None)

    def _read_counters(self, counters: ctypes.c_uint64, blocks: int) -> list[int]:
        host = (ctypes.c_uint64 * blocks)()
        self.call("cuMemcpyDtoH_v2", ctypes.cast(host, ctypes.c_void_p), counters, blocks * 8)
        return list(host)
