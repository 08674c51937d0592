"""Kernels tuned for a CUDA target, launched on PyTorch CUDA tensors through the driver API.

The scheduler returns the kernel's cubin (built by NVRTC for the target's
arch) and its launch: a 1-D grid and block, dynamic shared memory, and for
some schedules a workspace that must be zero before the first launch (each
launch leaves it zeroed). The kernel takes one argument by value: a struct of
the input pointers, the output pointers and, with a workspace, its pointer.
Everything runs in the device's primary context, the one PyTorch uses. The
driver (libcuda) is loaded only when a kernel is first called, so this module
imports, and its kernels can be inspected, on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ._errors import BuildError, FusorError, KernelArgumentError
from ._kernel import Kernel, check_tensor, torch_empty

_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_DEFAULT_SHARED_LIMIT = 48 * 1024
_MAX_GRID_X = 0x7FFFFFFF


class CudaDriver:
    """The few driver API entry points a kernel needs, from libcuda.so.1; every call in a device's primary context."""

    def __init__(self, library: str = "libcuda.so.1"):
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as e:
            raise BuildError(f"no CUDA driver ({library}: {e}); CUDA kernels need an NVIDIA GPU and its driver") from None
        rc = self._lib.cuInit(0)
        if rc != 0:
            raise BuildError(f"the CUDA driver did not initialise: {self._error(rc)}")
        self._contexts: Dict[int, ctypes.c_void_p] = {}

    def _error(self, rc: int) -> str:
        text = ctypes.c_char_p()
        self._lib.cuGetErrorString(rc, ctypes.byref(text))
        return f"CUDA error {rc} ({(text.value or b'?').decode()})"

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise FusorError(f"{what} failed: {self._error(rc)}")

    @contextlib.contextmanager
    def on(self, device: int) -> Iterator[None]:
        """Runs the block with `device`'s primary context current (retained on first use)."""
        if device not in self._contexts:
            ctx = ctypes.c_void_p()
            self._check(self._lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), ctypes.c_int(device)),
                        f"cuDevicePrimaryCtxRetain({device})")
            self._contexts[device] = ctx
        self._check(self._lib.cuCtxPushCurrent_v2(self._contexts[device]), "cuCtxPushCurrent")
        try:
            yield
        finally:
            self._lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def load(self, device: int, cubin: bytes, name: str, shared_bytes: int, argument_bytes: int) -> Tuple[int, int]:
        """Loads the cubin on `device`; its module and function. Checks the kernel's argument size where the
        driver can say it (CUDA 12.4 and later)."""
        with self.on(device):
            module = ctypes.c_void_p()
            self._check(self._lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
            fn = ctypes.c_void_p()
            self._check(self._lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                        f"cuModuleGetFunction({name})")
            if hasattr(self._lib, "cuFuncGetParamInfo"):
                offset, size = ctypes.c_size_t(), ctypes.c_size_t()
                if self._lib.cuFuncGetParamInfo(fn, ctypes.c_size_t(0), ctypes.byref(offset), ctypes.byref(size)) == 0 \
                        and size.value != argument_bytes:
                    raise BuildError(f"kernel {name} takes a {size.value}-byte argument; its metadata describes "
                                     f"{argument_bytes} bytes of pointers")
            if shared_bytes > _DEFAULT_SHARED_LIMIT:
                self._check(self._lib.cuFuncSetAttribute(fn, _MAX_DYNAMIC_SHARED, shared_bytes), "cuFuncSetAttribute")
            return module.value or 0, fn.value or 0

    def zeroed(self, device: int, nbytes: int, stream: int) -> int:
        """Device memory of `nbytes`, zero-filled in order on `stream` (before anything launched on it later)."""
        with self.on(device):
            ptr = ctypes.c_uint64()
            self._check(self._lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
            self._check(self._lib.cuMemsetD8Async(ptr, ctypes.c_ubyte(0), ctypes.c_size_t(nbytes),
                                                  ctypes.c_void_p(stream)), "cuMemsetD8Async")
            return ptr.value

    def launch(self, device: int, fn: int, grid: Tuple[int, int, int], block: Tuple[int, int, int],
               shared_bytes: int, stream: int, args: ctypes.Array) -> None:
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))  # kernelParams[0]: the argument struct
        with self.on(device):
            rc = self._lib.cuLaunchKernel(ctypes.c_void_p(fn), *(ctypes.c_uint(x) for x in grid),
                                          *(ctypes.c_uint(x) for x in block), ctypes.c_uint(shared_bytes),
                                          ctypes.c_void_p(stream), params, None)
        self._check(rc, "cuLaunchKernel")

    def release(self, device: int, modules: List[int], buffers: List[int]) -> None:
        """Frees buffers and unloads modules on `device` (errors ignored: this runs at teardown)."""
        with self.on(device):
            for ptr in buffers:
                self._lib.cuMemFree_v2(ctypes.c_uint64(ptr))
            for module in modules:
                self._lib.cuModuleUnload(ctypes.c_void_p(module))


class CudaKernel(Kernel):
    """A kernel tuned for a CUDA target: call it on contiguous PyTorch CUDA tensors in declaration order.

    It launches on the current PyTorch stream of the tensors' device (or
    ``stream=``, a CUDA stream handle) and returns without synchronizing.
    Launches sharing a workspace must not overlap, so a kernel that needs one
    keeps one per device and stream (launches on one stream run in order).
    :meth:`close` frees them; so does dropping the kernel.
    """

    language = "cuda"

    def __init__(self, response: Any, driver: Optional[CudaDriver] = None, name: str = ""):
        super().__init__(response, name)
        if not response.binary:
            missing = self.metadata.get("binary", {}).get("missing", "no reason given")
            raise BuildError(f"the scheduler returned no cubin for this CUDA kernel: {missing}")
        if response.binary_format != "cubin":
            raise BuildError(f"the scheduler returned a '{response.binary_format}' binary, not a cubin")
        self.cubin: bytes = response.binary
        launch = self.metadata.get("launch", {})
        self.grid = tuple(int(x) for x in launch.get("grid", [self.metadata.get("grid", 0), 1, 1]))
        self.block = tuple(int(x) for x in launch.get("block", [self.metadata.get("threads", 0), 1, 1]))
        self.shared_bytes = int(launch.get("dynamic_shared_bytes", self.metadata.get("shared_bytes", 0)))
        self.workspace_bytes = int(self.metadata.get("workspace_bytes", 0))
        if len(self.grid) != 3 or len(self.block) != 3 or min(self.grid + self.block) < 1 or \
                self.grid[0] > _MAX_GRID_X or max(self.grid[1:] + self.block) > 65535:
            raise BuildError(f"the scheduler's launch is not a valid grid and block: {self.grid}, {self.block}")
        pointers = len(self.inputs) + len(self.outputs) + (1 if self.workspace_bytes else 0)
        self._args = ctypes.c_void_p * pointers
        self._lock = threading.Lock()
        # What the driver holds for this kernel, freed by close() or when the kernel is dropped.
        self._held: Dict[str, Any] = {"driver": driver, "functions": {}, "modules": {}, "workspaces": {}}
        self._finalizer = weakref.finalize(self, CudaKernel._release, self._held)

    def _function(self, device: int, stream: int) -> Tuple[int, List[int]]:
        """The loaded function on `device`, and the workspace argument for `stream` (none or one pointer)."""
        held = self._held
        with self._lock:
            if held["driver"] is None:
                held["driver"] = CudaDriver()
            driver = held["driver"]
            if device not in held["functions"]:
                module, fn = driver.load(device, self.cubin, self.entry_point, self.shared_bytes,
                                         ctypes.sizeof(self._args))
                held["modules"][device], held["functions"][device] = module, fn
            if not self.workspace_bytes:
                return held["functions"][device], []
            if (device, stream) not in held["workspaces"]:
                held["workspaces"][(device, stream)] = driver.zeroed(device, self.workspace_bytes, stream)
            return held["functions"][device], [held["workspaces"][(device, stream)]]

    def arguments(self, inputs: List[Any], outputs: List[Any]) -> Tuple[int, List[int]]:
        """Checks the tensors; their device and data pointers, inputs then outputs, as the kernel's struct lists them."""
        device = None
        pointers = []
        for role, tensors, specs in (("input", inputs, self.inputs), ("output", outputs, self.outputs)):
            for t, spec in zip(tensors, specs):
                if not hasattr(t, "data_ptr") or not hasattr(t, "device"):
                    raise KernelArgumentError(f"{role} {spec.name} must be a PyTorch CUDA tensor, got {type(t).__name__}")
                check_tensor(t, spec, role, "cuda", writable=role == "output")
                index = t.device.index or 0
                if device is None:
                    device = index
                elif index != device:
                    raise KernelArgumentError(f"{role} {spec.name} is on cuda:{index}, the others on cuda:{device}")
                pointers.append(t.data_ptr())
        assert device is not None  # a kernel has inputs
        return device, pointers

    def __call__(self, *args: Any, out: Any = None, stream: Optional[int] = None) -> Any:
        outs = self._check_count(args, out)
        torch = sys.modules.get("torch")
        if outs is None:
            if torch is None:
                raise KernelArgumentError("CUDA kernels run on PyTorch tensors: import torch, or pass out=")
            device = getattr(args[0], "device", "cuda")
            outs = [torch_empty(s, device) for s in self.outputs]
        device, pointers = self.arguments(list(args), list(outs))
        if stream is None:
            stream = torch.cuda.current_stream(device).cuda_stream if torch is not None else 0
        fn, workspace = self._function(device, stream)
        self._held["driver"].launch(device, fn, self.grid, self.block, self.shared_bytes, stream,
                                    self._args(*pointers, *workspace))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run_pointers(self, inputs: Sequence[int], outputs: Sequence[int], *, device: int = 0,
                     stream: Optional[int] = None, dims: Sequence[int] = ()) -> None:
        if dims:
            raise KernelArgumentError(f"{self._what()} takes exact sizes: a CUDA kernel serves no range")
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs):
            raise KernelArgumentError(f"{self._what()} takes {len(self.inputs)} inputs and {len(self.outputs)} outputs")
        if stream is None:
            torch = sys.modules.get("torch")
            stream = torch.cuda.current_stream(device).cuda_stream if torch is not None else 0
        fn, workspace = self._function(device, stream)
        self._held["driver"].launch(device, fn, self.grid, self.block, self.shared_bytes, stream,
                                    self._args(*inputs, *outputs, *workspace))

    def close(self) -> None:
        """Frees the workspaces and unloads the module (after the launches queued so far: callers synchronize)."""
        self._finalizer()

    @staticmethod
    def _release(held: Dict[str, Any]) -> None:
        driver = held["driver"]
        if driver is None:
            return
        for device, module in held["modules"].items():
            buffers = [ptr for (d, _), ptr in held["workspaces"].items() if d == device]
            try:
                driver.release(device, [module], buffers)
            except Exception:  # noqa: BLE001 (teardown: the context may be gone already)
                pass
        held["modules"].clear()
        held["functions"].clear()
        held["workspaces"].clear()
