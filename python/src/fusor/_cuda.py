"""Kernels tuned for a CUDA target, launched on PyTorch CUDA tensors through the driver API.

The scheduler returns the kernel's cubin (built by NVRTC for the target's
arch) and its launch: a 1-D grid and block, dynamic shared memory, and for
some schedules a workspace that must be zero before the first launch (each
launch leaves it zeroed). The kernel takes one argument by value: a struct of
the input pointers, the output pointers and, with a workspace, its pointer.
The driver (libcuda) is loaded only when a kernel is first called, so this
module imports and its kernels can be inspected on machines without a GPU.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from ._errors import BuildError, FusorError, KernelArgumentError
from ._kernel import TORCH_DTYPES, Kernel

_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_DEFAULT_SHARED_LIMIT = 48 * 1024


class CudaDriver:
    """The few driver API entry points a kernel needs, from libcuda.so.1."""

    def __init__(self, library: str = "libcuda.so.1"):
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as e:
            raise BuildError(f"no CUDA driver ({library}: {e}); CUDA kernels need an NVIDIA GPU and its driver") from None
        self._check(self._lib.cuInit(0), "cuInit")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            text = ctypes.c_char_p()
            self._lib.cuGetErrorString(rc, ctypes.byref(text))
            raise FusorError(f"{what} failed: CUDA error {rc} ({(text.value or b'?').decode()})")

    def ensure_context(self, device: int) -> None:
        """Makes the device's primary context current when none is (PyTorch makes it current once it runs there)."""
        ctx = ctypes.c_void_p()
        self._check(self._lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if ctx.value:
            return
        dev = ctypes.c_int()
        self._check(self._lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        self._check(self._lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._check(self._lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load(self, cubin: bytes, name: str, shared_bytes: int) -> int:
        module = ctypes.c_void_p()
        self._check(self._lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
        fn = ctypes.c_void_p()
        self._check(self._lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), "cuModuleGetFunction")
        if shared_bytes > _DEFAULT_SHARED_LIMIT:
            self._check(self._lib.cuFuncSetAttribute(fn, _MAX_DYNAMIC_SHARED, shared_bytes), "cuFuncSetAttribute")
        return fn.value

    def zeroed(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._check(self._lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        self._check(self._lib.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0), ctypes.c_size_t(nbytes)), "cuMemsetD8")
        return ptr.value

    def launch(self, fn: int, grid: Tuple[int, int, int], block: Tuple[int, int, int], shared_bytes: int,
               stream: int, args: ctypes.Array) -> None:
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        rc = self._lib.cuLaunchKernel(ctypes.c_void_p(fn), *(ctypes.c_uint(x) for x in grid),
                                      *(ctypes.c_uint(x) for x in block), ctypes.c_uint(shared_bytes),
                                      ctypes.c_void_p(stream), params, None)
        self._check(rc, "cuLaunchKernel")


class CudaKernel(Kernel):
    """A kernel tuned for a CUDA target: call it on contiguous PyTorch CUDA tensors in declaration order.

    It launches on the current PyTorch stream of the tensors' device (or
    ``stream=``, a CUDA stream handle) and returns without synchronizing.
    Launches sharing a workspace must not overlap, so a kernel that needs one
    keeps one per device and stream (launches on one stream run in order).
    """

    language = "cuda"

    def __init__(self, response: Any, driver: Optional[CudaDriver] = None):
        super().__init__(response)
        if not response.binary:
            missing = self.metadata.get("binary", {}).get("missing", "no reason given")
            raise BuildError(f"the scheduler returned no cubin for this CUDA kernel: {missing}")
        if response.binary_format != "cubin":
            raise BuildError(f"the scheduler returned a '{response.binary_format}' binary, not a cubin")
        self.cubin: bytes = response.binary
        launch = self.metadata.get("launch", {})
        self.grid = tuple(launch.get("grid", [self.metadata.get("grid", 0), 1, 1]))
        self.block = tuple(launch.get("block", [self.metadata.get("threads", 0), 1, 1]))
        self.shared_bytes = int(launch.get("dynamic_shared_bytes", self.metadata.get("shared_bytes", 0)))
        self.workspace_bytes = int(self.metadata.get("workspace_bytes", 0))
        if len(self.grid) != 3 or len(self.block) != 3 or min(self.grid) < 1 or min(self.block) < 1:
            raise BuildError(f"the scheduler's launch is not a grid and block of 3 positive extents: {launch}")
        self._driver = driver
        self._functions: Dict[int, int] = {}
        self._workspaces: Dict[Tuple[int, int], int] = {}
        self._args = ctypes.c_void_p * (len(self.inputs) + len(self.outputs) + (1 if self.workspace_bytes else 0))
        self._lock = threading.Lock()

    def _function(self, device: int, stream: int) -> Tuple[int, List[int]]:
        """The loaded function on `device`, and the workspace argument for `stream` (none or one pointer)."""
        with self._lock:
            if self._driver is None:
                self._driver = CudaDriver()
            if device not in self._functions:
                self._driver.ensure_context(device)
                self._functions[device] = self._driver.load(self.cubin, self.entry_point, self.shared_bytes)
            if not self.workspace_bytes:
                return self._functions[device], []
            if (device, stream) not in self._workspaces:
                self._workspaces[(device, stream)] = self._driver.zeroed(self.workspace_bytes)
            return self._functions[device], [self._workspaces[(device, stream)]]

    def arguments(self, inputs: List[Any], outputs: List[Any]) -> Tuple[int, List[int]]:
        """Checks the tensors; their device and data pointers, inputs then outputs, as the kernel's struct lists them."""
        device = None
        pointers = []
        for role, tensors, specs in (("input", inputs, self.inputs), ("output", outputs, self.outputs)):
            for t, spec in zip(tensors, specs):
                if not hasattr(t, "data_ptr") or not hasattr(t, "device"):
                    raise KernelArgumentError(f"{role} {spec.name} must be a PyTorch CUDA tensor, got {type(t).__name__}")
                if t.device.type != "cuda":
                    raise KernelArgumentError(f"{role} {spec.name} is on {t.device}; this kernel runs on a CUDA GPU")
                if device is None:
                    device = t.device.index or 0
                elif (t.device.index or 0) != device:
                    raise KernelArgumentError(f"{role} {spec.name} is on cuda:{t.device.index}, the others on cuda:{device}")
                if str(t.dtype) != TORCH_DTYPES[spec.dtype]:
                    raise KernelArgumentError(f"{role} {spec.name} must be {TORCH_DTYPES[spec.dtype]}, got {t.dtype}")
                if tuple(t.shape) != spec.shape:
                    raise KernelArgumentError(f"{role} {spec.name} must have shape {spec.shape}, got {tuple(t.shape)}")
                if not t.is_contiguous():
                    raise KernelArgumentError(f"{role} {spec.name} must be contiguous (.contiguous())")
                pointers.append(t.data_ptr())
        return device, pointers

    def __call__(self, *args: Any, out: Any = None, stream: Optional[int] = None) -> Any:
        outs = self._check_count(args, out)
        if outs is None:
            torch = sys.modules.get("torch")
            if torch is None:
                raise KernelArgumentError("CUDA kernels run on PyTorch tensors: import torch, or pass out=")
            first = args[0]
            outs = [torch.empty(s.shape, dtype=getattr(torch, TORCH_DTYPES[s.dtype][6:]), device=first.device)
                    for s in self.outputs]
        device, pointers = self.arguments(list(args), list(outs))
        if stream is None:
            torch = sys.modules.get("torch")
            stream = torch.cuda.current_stream(device).cuda_stream if torch is not None else 0
        fn, workspace = self._function(device, stream)
        self._driver.launch(fn, self.grid, self.block, self.shared_bytes, stream, self._args(*pointers, *workspace))
        return outs[0] if len(outs) == 1 else tuple(outs)
