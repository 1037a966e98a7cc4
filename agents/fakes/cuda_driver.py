"""A fake ``libcuda.so.1`` for ``agents.cuda_driver``, shipped with the code (docs/design.md, House rules).

``FakeLibcuda`` is what ``ctypes.CDLL("libcuda.so.1")`` would return: an object whose driver
functions are real C function pointers (ctypes callbacks), so every call goes through the
argument conversion that ``CudaDriver`` declares in ``SIGNATURES``, as it would into the
driver. Behind them: device memory as host buffers (device pointers are their addresses),
a JIT that accepts only PTX with the entry asked for, a launch that checks its parameter
count against that entry and writes each block's loop count where the kernel would, the
driver's error names and texts, and an optional memory limit past which ``cuMemAlloc_v2``
returns ``CUDA_ERROR_OUT_OF_MEMORY`` (what an MPS client sees past its pinned limit).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from typing import Any

from agents.cuda_driver import SIGNATURES

__all__ = ["FakeCudaDevice", "FakeLibcuda", "Launch"]

# The driver's codes (cuda.h) and what cuGetErrorName / cuGetErrorString say for them.
_ERRORS = {
    1: (b"CUDA_ERROR_INVALID_VALUE", b"invalid argument"),
    2: (b"CUDA_ERROR_OUT_OF_MEMORY", b"out of memory"),
    3: (b"CUDA_ERROR_NOT_INITIALIZED", b"initialization error"),
    101: (b"CUDA_ERROR_INVALID_DEVICE", b"invalid device ordinal"),
    201: (b"CUDA_ERROR_INVALID_CONTEXT", b"invalid device context"),
    218: (b"CUDA_ERROR_INVALID_PTX", b"a PTX JIT compilation failed"),
    500: (b"CUDA_ERROR_NOT_FOUND", b"named symbol not found"),
}
_ERROR_NAMES = {code: ctypes.c_char_p(name) for code, (name, _) in _ERRORS.items()}  # kept alive: C reads them
_ERROR_TEXTS = {code: ctypes.c_char_p(text) for code, (_, text) in _ERRORS.items()}
_MIB = 1024 * 1024


@dataclass
class FakeCudaDevice:
    name: str = "NVIDIA H200"
    uuid: bytes = bytes(range(16))
    sm_count: int = 132
    compute_capability: tuple[int, int] = (9, 0)
    memory_bytes: int = 143771 * _MIB


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: tuple[int, ...]  # the kernel's u64 parameters, as the kernel would read them


@dataclass
class _State:
    initialised: bool = False
    current: int | None = None  # device whose primary context is current
    retained: dict[int, int] = field(default_factory=dict)  # device -> primary context references
    buffers: dict[int, Any] = field(default_factory=dict)  # device pointer -> host buffer
    modules: dict[int, str] = field(default_factory=dict)  # module handle -> PTX
    functions: dict[int, tuple[str, int]] = field(default_factory=dict)  # handle -> (entry, its parameter count)


def _void_pointer_types(argtypes: tuple[Any, ...]) -> tuple[Any, ...]:
    # A callback receives a c_char_p argument as a bytes copy; as void* it gets the address
    # and can write through it, as the driver does (same ABI either way).
    return tuple(ctypes.c_void_p if t is ctypes.c_char_p else t for t in argtypes)


class FakeLibcuda:
    """The driver functions ``CudaDriver`` uses, over ``devices``; see the module docstring."""

    def __init__(self, *, devices: list[FakeCudaDevice] | None = None, memory_limit_mb: int | None = None) -> None:
        self.devices = devices if devices is not None else [FakeCudaDevice()]
        self.memory_limit_mb = memory_limit_mb
        self.launches: list[Launch] = []
        self.calls: list[str] = []
        self.state = _State()
        self._keep: list[Any] = []
        for name, argtypes in SIGNATURES.items():
            prototype = ctypes.CFUNCTYPE(ctypes.c_int, *_void_pointer_types(argtypes))
            implementation = getattr(self, "_" + name)
            pointer = prototype(self._logged(name, implementation))
            self._keep.append(pointer)
            setattr(self, name, pointer)

    def _logged(self, name: str, implementation: Any) -> Any:
        def call(*args: Any) -> int:
            self.calls.append(name)
            return int(implementation(*args))

        return call

    def held_bytes(self) -> int:
        return sum(len(b) for b in self.state.buffers.values())

    # -- errors, init, devices ----------------------------------------------------------------

    def _cuGetErrorName(self, code: int, out: Any) -> int:
        if code not in _ERROR_NAMES:
            return 1
        out[0] = _ERROR_NAMES[code]
        return 0

    def _cuGetErrorString(self, code: int, out: Any) -> int:
        if code not in _ERROR_TEXTS:
            return 1
        out[0] = _ERROR_TEXTS[code]
        return 0

    def _cuInit(self, flags: int) -> int:
        if flags != 0:
            return 1
        self.state.initialised = True
        return 0

    def _cuDriverGetVersion(self, out: Any) -> int:
        out[0] = 12040
        return 0

    def _device(self, ordinal: int) -> FakeCudaDevice | int:
        if not self.state.initialised:
            return 3
        if not 0 <= ordinal < len(self.devices):
            return 101
        return self.devices[ordinal]

    def _cuDeviceGetCount(self, out: Any) -> int:
        if not self.state.initialised:
            return 3
        out[0] = len(self.devices)
        return 0

    def _cuDeviceGet(self, out: Any, ordinal: int) -> int:
        device = self._device(ordinal)
        if isinstance(device, int):
            return device
        out[0] = ordinal
        return 0

    def _cuDeviceGetName(self, buffer: int, length: int, dev: int) -> int:
        device = self._device(dev)
        if isinstance(device, int):
            return device
        name = device.name.encode()[: length - 1] + b"\0"
        ctypes.memmove(buffer, name, len(name))
        return 0

    def _cuDeviceGetAttribute(self, out: Any, attribute: int, dev: int) -> int:
        device = self._device(dev)
        if isinstance(device, int):
            return device
        values = {16: device.sm_count, 75: device.compute_capability[0], 76: device.compute_capability[1]}
        if attribute not in values:
            return 1
        out[0] = values[attribute]
        return 0

    def _cuDeviceTotalMem_v2(self, out: Any, dev: int) -> int:
        device = self._device(dev)
        if isinstance(device, int):
            return device
        out[0] = device.memory_bytes
        return 0

    def _cuDeviceGetUuid(self, buffer: int, dev: int) -> int:
        device = self._device(dev)
        if isinstance(device, int):
            return device
        ctypes.memmove(buffer, device.uuid, 16)
        return 0

    # -- contexts -----------------------------------------------------------------------------

    def _cuDevicePrimaryCtxRetain(self, out: Any, dev: int) -> int:
        device = self._device(dev)
        if isinstance(device, int):
            return device
        self.state.retained[dev] = self.state.retained.get(dev, 0) + 1
        out[0] = 0x1000 + dev
        return 0

    def _cuDevicePrimaryCtxRelease_v2(self, dev: int) -> int:
        if self.state.retained.get(dev, 0) < 1:
            return 201
        self.state.retained[dev] -= 1
        return 0

    def _cuCtxSetCurrent(self, context: int | None) -> int:
        dev = (context or 0) - 0x1000
        if self.state.retained.get(dev, 0) < 1:
            return 201
        self.state.current = dev
        return 0

    def _cuCtxSynchronize(self) -> int:
        return 0 if self.state.current is not None else 201

    # -- memory -------------------------------------------------------------------------------

    def _cuMemAlloc_v2(self, out: Any, size: int) -> int:
        if self.state.current is None:
            return 201
        if size == 0:
            return 1
        limit = self.memory_limit_mb * _MIB if self.memory_limit_mb is not None else None
        if limit is not None and self.held_bytes() + size > limit:
            return 2
        buffer = ctypes.create_string_buffer(size)
        address = ctypes.addressof(buffer)
        self.state.buffers[address] = buffer
        out[0] = address
        return 0

    def _in_bounds(self, pointer: int, size: int) -> bool:
        return any(base <= pointer and pointer + size <= base + len(b) for base, b in self.state.buffers.items())

    def _cuMemsetD8_v2(self, pointer: int, value: int, count: int) -> int:
        if not self._in_bounds(pointer, count):
            return 1
        ctypes.memset(pointer, value, count)
        return 0

    def _cuMemcpyDtoH_v2(self, host: int, pointer: int, count: int) -> int:
        if not self._in_bounds(pointer, count):
            return 1
        ctypes.memmove(host, pointer, count)
        return 0

    def _cuMemFree_v2(self, pointer: int) -> int:
        return 0 if self.state.buffers.pop(pointer, None) is not None else 1

    # -- modules and launches -----------------------------------------------------------------

    def _cuModuleLoadDataEx(self, out: Any, image: int, count: int, options: Any, values: Any) -> int:
        ptx = ctypes.string_at(image).decode()
        if not re.search(r"^\.version \d+\.\d+$", ptx, re.M) or ".entry" not in ptx:
            log = b"ptxas fatal: not a PTX module\0"
            for i in range(count):
                if options[i] == 5:  # CU_JIT_ERROR_LOG_BUFFER
                    ctypes.memmove(values[i], log, len(log))
            return 218
        handle = 0x2000 + len(self.state.modules)
        self.state.modules[handle] = ptx
        out[0] = handle
        return 0

    def _cuModuleGetFunction(self, out: Any, module: int, name: int) -> int:
        ptx = self.state.modules.get(module or 0)
        if ptx is None:
            return 1
        entry = ctypes.string_at(name).decode()
        match = re.search(rf"\.entry {re.escape(entry)}\((.*?)\)", ptx, re.S)
        if match is None:
            return 500
        handle = 0x3000 + len(self.state.functions)
        self.state.functions[handle] = (entry, match.group(1).count(".param"))
        out[0] = handle
        return 0

    def _cuModuleUnload(self, module: int) -> int:
        return 0 if self.state.modules.pop(module or 0, None) is not None else 1

    def _cuLaunchKernel(self, function: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,  # noqa: PLR0917 - the driver API's own signature
                        shared: int, stream: int | None, params: Any, extra: Any) -> int:
        known = self.state.functions.get(function or 0)
        if known is None or not params:
            return 1
        _, count = known
        values = tuple(ctypes.c_uint64.from_address(params[i]).value for i in range(count))
        self.launches.append(Launch(grid=(gx, gy, gz), block=(bx, by, bz), params=values))
        out, duration_ns = values[0], values[1]
        if not self._in_bounds(out, gx * 8):
            return 1  # the kernel would fault writing iterations[blockIdx.x]
        for block in range(gx):
            ctypes.c_uint64.from_address(out + 8 * block).value = duration_ns // 1000 + block + 1
        return 0
