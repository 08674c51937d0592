"""Tuned kernels, callable from Python.

A CPU kernel is the C++ source the scheduler returned, built once on this
machine with the flags it was tuned with, into a cache directory keyed by
workload key and target, and called through ctypes (which releases the GIL
for the call). The emitted entry point is
``int fusor_run(const void* const* inputs, void* const* outputs, int num_threads)``
with every tensor dense, row-major, in declaration order.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._embedded import lowest_priority
from ._errors import BuildError, FusorError, KernelArgumentError
from ._result import Result

# bf16 has no NumPy dtype: its arrays are passed as their uint16 bits.
NUMPY_DTYPES: Dict[str, np.dtype] = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16)}
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class TensorSpec:
    """One argument of a kernel: its name, shape and element type (f32, f16 or bf16)."""

    name: str
    shape: Tuple[int, ...]  # a kernel of a range of sizes: at their largest
    dtype: str
    constant: bool = False  # declared `const` in the chain: the same from call to call (a model's weights)
    # Per axis, the ranged dim whose size it has at each call (None: its extent is fixed); empty: none.
    dims: Tuple[Optional[str], ...] = ()

    def at(self, sizes: Dict[str, int]) -> "TensorSpec":
        """The spec at these sizes of ranged dims."""
        if not self.dims:
            return self
        return TensorSpec(self.name, tuple(sizes[d] if d is not None else e for d, e in zip(self.dims, self.shape)),
                          self.dtype, self.constant)


def _specs(entries: Sequence[Dict[str, Any]]) -> List[TensorSpec]:
    return [TensorSpec(e["name"], tuple(int(x) for x in e["shape"]), e["dtype"], bool(e.get("constant", False)),
                       tuple(e.get("dims", ())))
            for e in entries]


# The kernel cache's size, beyond which the least recently used kernels are removed.
CACHE_BYTES = 256 << 20


def default_cache_dir() -> Path:
    """$FUSOR_CACHE_DIR, else $XDG_CACHE_HOME/fusor/kernels, else ~/.cache/fusor/kernels."""
    if os.environ.get("FUSOR_CACHE_DIR"):
        return Path(os.environ["FUSOR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fusor" / "kernels"


def _torch_tensor_type() -> Optional[type]:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def torch_empty(spec: TensorSpec, device: Any = "cpu") -> Any:
    """An uninitialised PyTorch tensor for `spec`."""
    import torch

    return torch.empty(spec.shape, dtype=getattr(torch, TORCH_DTYPES[spec.dtype]), device=device)


def check_tensor(t: Any, spec: TensorSpec, role: str, device: str, writable: bool) -> None:
    """Raises KernelArgumentError unless `t` is a contiguous PyTorch tensor of `spec` on `device` ("cpu", "cuda")."""
    if t.device.type != device:
        where = "the CPU" if device == "cpu" else "a CUDA GPU"
        raise KernelArgumentError(f"{role} {spec.name} is on {t.device}; this kernel runs on {where}")
    if str(t.dtype) != "torch." + TORCH_DTYPES[spec.dtype]:
        raise KernelArgumentError(f"{role} {spec.name} must be torch.{TORCH_DTYPES[spec.dtype]}, got {t.dtype}")
    if tuple(t.shape) != spec.shape:
        raise KernelArgumentError(f"{role} {spec.name} must have shape {spec.shape}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise KernelArgumentError(f"{role} {spec.name} must be contiguous (.contiguous())")
    if writable and t.requires_grad:
        raise KernelArgumentError(f"output {spec.name} requires grad; fusor kernels do not record gradients")


class Kernel:
    """A tuned kernel returned by :meth:`fusor.Client.compile`.

    Call it with the chain's inputs in declaration order; it returns the
    output (or a tuple of outputs when the chain has several), allocated
    unless ``out=`` gives them. :attr:`inputs` and :attr:`outputs` say what
    it takes and gives; :attr:`result` is the tuning result it came from.
    """

    language = ""

    def __init__(self, response: Any, name: str = ""):
        self.name = name or response.entry_point
        self.result = Result.from_proto(response.result)
        self.source: str = response.kernel_source
        self.entry_point: str = response.entry_point
        self.metadata: Dict[str, Any] = json.loads(response.metadata_json or "{}")
        self.inputs: List[TensorSpec] = _specs(self.metadata.get("inputs", []))
        self.outputs: List[TensorSpec] = _specs(self.metadata.get("outputs", []))
        if not self.inputs or not self.outputs:
            raise BuildError("the scheduler's answer lists no inputs or outputs (metadata_json)")
        # The ranged dims (name, smallest, largest) whose sizes the kernel takes at each call, in the order it
        # takes them; empty for a kernel of exact sizes.
        self.ranges: List[Tuple[str, int, int]] = [(d["name"], int(d["min"]), int(d["max"]))
                                                   for d in self.metadata.get("dims", [])]

    def covers(self, sizes: Dict[str, int]) -> bool:
        """Whether these sizes of its ranged dims are in the kernel's ranges."""
        return all(name in sizes and lo <= sizes[name] <= hi for name, lo, hi in self.ranges)

    def sizes_of(self, args: Sequence[Any]) -> Dict[str, int]:
        """The sizes of the ranged dims, read from the inputs' shapes (empty for a kernel of exact sizes);
        KernelArgumentError when the inputs disagree or a size is out of range."""
        sizes: Dict[str, int] = {}
        for a, spec in zip(args, self.inputs):
            shape = tuple(getattr(a, "shape", ()))
            for axis, dim in enumerate(spec.dims):
                if dim is None or axis >= len(shape):
                    continue
                size = int(shape[axis])
                if sizes.setdefault(dim, size) != size:
                    raise KernelArgumentError(f"input {spec.name} has {dim}={size}, an earlier input {dim}={sizes[dim]}")
        for name, lo, hi in self.ranges:
            if name not in sizes:
                raise KernelArgumentError(f"no input of {self._what()} gives the size of {name}")
            if not lo <= sizes[name] <= hi:
                raise KernelArgumentError(f"{name}={sizes[name]} is outside {self._what()}'s range {lo}..{hi}")
        return sizes

    @property
    def workload_key(self) -> str:
        return self.result.workload_key

    @property
    def schedule(self) -> str:
        return self.result.schedule

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def run_pointers(self, inputs: Sequence[int], outputs: Sequence[int], *, device: int = 0,
                     stream: Optional[int] = None, dims: Sequence[int] = ()) -> None:
        """Runs the kernel on raw data pointers, inputs then outputs in declaration order, each the first element
        of a buffer laid out as its spec says (a CUDA kernel on `device` and `stream`); a kernel of a range of
        sizes at `dims`, the sizes of :attr:`ranges` in order (empty: the largest). Nothing is checked: this is
        for callers that lay out the buffers themselves (fusor.torch reads strided views in place)."""
        raise NotImplementedError

    def _check_count(self, args: Sequence[Any], out: Any) -> Optional[Sequence[Any]]:
        if len(args) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise KernelArgumentError(f"{self._what()} takes {len(self.inputs)} inputs ({names}), got {len(args)}")
        if out is None:
            return None
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if len(outs) != len(self.outputs):
            names = ", ".join(s.name for s in self.outputs)
            raise KernelArgumentError(f"{self._what()} writes {len(self.outputs)} outputs ({names}), out= has {len(outs)}")
        return outs

    def _what(self) -> str:
        return f"kernel '{self.name}'"

    @property
    def constants(self) -> List[TensorSpec]:
        """The inputs the chain declares constant (``const``), in declaration order."""
        return [s for s in self.inputs if s.constant]

    def prepare(self, *constants: Any) -> "PreparedKernel":
        """Takes the constant inputs (:attr:`constants`, in order) once and returns a callable of the other inputs.

        A kernel that packs its constant inputs into its own layout does so here, once; its calls then skip that
        work. Other kernels (an unfused answer, a CUDA kernel) keep the constants and pass them on every call.
        The constants must not change while the prepared kernel is in use."""
        specs = self.constants
        if len(constants) != len(specs):
            names = ", ".join(s.name for s in specs) or "none"
            raise KernelArgumentError(f"{self._what()} has {len(specs)} constant inputs ({names}), got {len(constants)}")
        return PreparedKernel(self, list(constants))

    def prepare_pointers(self, inputs: Sequence[int]) -> "PreparedKernel":
        """:meth:`prepare` on raw pointers: every input's in declaration order (those not constant may be 0),
        laid out as its spec says. Nothing is checked, and the caller keeps the constants alive and unchanged;
        the result's :meth:`PreparedKernel.run_pointers` takes the other inputs' pointers."""
        if len(inputs) != len(self.inputs):
            raise KernelArgumentError(f"{self._what()} takes {len(self.inputs)} inputs")
        return PreparedKernel(self, [], inputs)

    def _prepare_pointers(self, inputs: Sequence[int]) -> Optional[int]:
        """The prepared state for these input pointers (constants set, the others 0), or None where the kernel
        has no prepare step."""
        return None

    def _run_prepared(self, state: int, inputs: Sequence[int], outputs: Sequence[int], dims: Sequence[int] = ()) -> None:
        raise NotImplementedError

    def _release_prepared(self, state: int) -> None:
        pass

    def __repr__(self) -> str:
        sig = ", ".join(f"{s.name}{list(s.shape)}:{s.dtype}" for s in self.inputs)
        outs = ", ".join(f"{s.name}{list(s.shape)}" for s in self.outputs)
        return f"<fusor {self.language} Kernel {self.name} ({sig}) -> ({outs}), schedule {self.schedule!r}>"


class PreparedKernel:
    """A kernel with its constant inputs taken once (:meth:`Kernel.prepare`). Call it with the other inputs, in
    declaration order; ``out=`` and ``num_threads=`` as for the kernel."""

    def __init__(self, kernel: Kernel, constants: List[Any], pointers: Optional[Sequence[int]] = None):
        self.kernel = kernel
        self.inputs = [s for s in kernel.inputs if not s.constant]
        self._constants = constants  # kept alive: the prepared state may point into them
        self._state: Optional[int] = None
        self._pointers: List[int] = list(pointers or [])  # of every input, the others' 0 (CPU kernels)
        if kernel.language == "c++" and not self._pointers:
            consts = iter(constants)
            tensor_type = _torch_tensor_type()
            self._pointers = [kernel._pointer(next(consts), spec, tensor_type,  # type: ignore[attr-defined]
                                              "constant input", writable=False) if spec.constant else 0
                              for spec in kernel.inputs]
        if self._pointers:
            self._state = kernel._prepare_pointers(self._pointers)

    def _full(self, args: Sequence[Any]) -> List[Any]:
        if len(self._constants) != len(self.kernel.constants):
            raise KernelArgumentError(f"{self.kernel._what()} was prepared on pointers: call run_pointers")
        if len(args) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise KernelArgumentError(f"prepared {self.kernel._what()} takes {len(self.inputs)} inputs ({names}), "
                                      f"got {len(args)}")
        rest, consts = iter(args), iter(self._constants)
        return [next(consts) if s.constant else next(rest) for s in self.kernel.inputs]

    def __call__(self, *args: Any, out: Any = None, num_threads: Optional[int] = None) -> Any:
        full = self._full(args)
        if self._state is None:
            return self.kernel(*full, out=out, num_threads=num_threads)
        return self.kernel._call_prepared(self._state, full, out, num_threads)  # type: ignore[attr-defined]

    def run_pointers(self, inputs: Sequence[int], outputs: Sequence[int], dims: Sequence[int] = ()) -> None:
        """As :meth:`Kernel.run_pointers`, with the pointers of the non-constant inputs only."""
        if not self._pointers:
            raise KernelArgumentError(f"{self.kernel._what()} is not a CPU kernel: call run_pointers on it")
        if len(inputs) != len(self.inputs):
            raise KernelArgumentError(f"prepared {self.kernel._what()} takes {len(self.inputs)} inputs")
        rest = iter(inputs)
        full = [p if s.constant else next(rest) for s, p in zip(self.kernel.inputs, self._pointers)]
        if self._state is None:
            self.kernel.run_pointers(full, outputs, dims=dims)
        else:
            self.kernel._run_prepared(self._state, full, outputs, dims)

    @property
    def packs(self) -> bool:
        """Whether the kernel packed the constants once (False: they are passed on every call)."""
        return self._state is not None

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state is not None:
            self.kernel._release_prepared(state)


@functools.lru_cache(maxsize=None)
def host_flags() -> frozenset:
    """This CPU's feature flags (/proc/cpuinfo); empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _evict(cache_dir: Path, keep: Path) -> None:
    """Removes the least recently used kernels (by modification time, which a use refreshes) until the cache
    holds at most CACHE_BYTES; never `keep`. A process that has loaded a removed kernel keeps it."""
    files = []
    for path in cache_dir.glob("*/*.so"):
        try:
            st = path.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= CACHE_BYTES:
            break
        if path == keep:
            continue
        try:
            path.unlink()
            total -= size
        except OSError:
            pass


class CpuKernel(Kernel):
    """A kernel tuned for a CPU target, built here with the recorded flags and called through ctypes."""

    language = "c++"

    def __init__(self, response: Any, cache_dir: Optional[Union[str, os.PathLike]] = None,
                 compiler: Optional[str] = None, num_threads: Optional[int] = None, name: str = "",
                 background: bool = False):
        super().__init__(response, name)
        self._background = background  # built at the lowest CPU priority (beside a serving process's requests)
        self._check_host()
        self.flags: List[str] = list(self.metadata.get("compile_flags", []))
        # An unfused answer calls the vendor library it was measured with.
        self.libs: List[str] = [f"-l{lib}" for lib in self.metadata.get("link_libs", [])]
        self.compiler = compiler or os.environ.get("CXX") or "c++"
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self.library_path = self._build(Path(cache_dir) if cache_dir else default_cache_dir())
        try:
            self._lib = ctypes.CDLL(str(self.library_path))  # CDLL: the GIL is released during calls
            fn = getattr(self._lib, self.entry_point)
        except (OSError, AttributeError) as e:
            raise BuildError(f"cannot load {self.library_path}: {e}") from None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn
        # A kernel of a range of sizes: its entry points that take them first.
        ranged = bool(self.ranges)
        self._fn_dims: Any = None
        if ranged:
            self._fn_dims = self._entry("fusor_run_dims", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                           ctypes.c_int], ctypes.c_int)
        self._prepare_fns: Optional[Tuple[Any, Any, Any, Any]] = None
        if self.metadata.get("prepare"):
            prepare = self._entry("fusor_prepare", [ctypes.c_void_p], ctypes.c_void_p)
            run = self._entry("fusor_run_prepared", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int],
                              ctypes.c_int)
            release = self._entry("fusor_release", [ctypes.c_void_p], None)
            run_dims = self._entry("fusor_run_prepared_dims", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                               ctypes.c_void_p, ctypes.c_int], ctypes.c_int) \
                if ranged else None
            self._prepare_fns = (prepare, run, release, run_dims)
        self._in_array = ctypes.c_void_p * len(self.inputs)
        self._out_array = ctypes.c_void_p * len(self.outputs)
        self._dims_array = ctypes.c_long * max(1, len(self.ranges))

    def _entry(self, name: str, argtypes: List[Any], restype: Any) -> Any:
        try:
            fn = getattr(self._lib, name)
        except AttributeError as e:
            raise BuildError(f"{self.library_path} lacks {name}: {e}") from None
        fn.argtypes, fn.restype = argtypes, restype
        return fn

    def _run(self, state: Optional[int], ins: Any, outs: Any, threads: int, dims: Sequence[int]) -> None:
        """One call: fusor_run, or its prepared (`state`) or sized (`dims`) variants."""
        if dims and self._fn_dims is None:
            raise KernelArgumentError(f"{self._what()} takes exact sizes, not dims={list(dims)}")
        sizes = self._dims_array(*dims) if dims else None
        if state is None:
            rc = self._fn_dims(sizes, ins, outs, threads) if sizes is not None else self._fn(ins, outs, threads)
        else:
            assert self._prepare_fns is not None
            rc = (self._prepare_fns[3](state, sizes, ins, outs, threads) if sizes is not None
                  else self._prepare_fns[1](state, ins, outs, threads))
        if rc != 0:
            raise FusorError(f"{self._what()} returned {rc}" + (" (a size out of its range)" if rc == 2 else ""))

    def _check_host(self) -> None:
        target = self.result.target
        machine = platform.machine()
        arch = target.arch
        if arch.startswith("x86-64") and machine not in ("x86_64", "AMD64"):
            raise BuildError(f"the kernel was tuned for {arch} ({target.device_name}); this machine is {machine}")
        missing = sorted(set(target.isa_features) - host_flags())
        if missing and host_flags():
            raise BuildError(f"the kernel was tuned for {arch} ({target.device_name}) and uses "
                             f"{', '.join(missing)}, which this CPU lacks; tune it on a worker like this machine")

    def _build(self, cache_dir: Path) -> Path:
        """The shared object of the source, built once per source, flags, compiler and host CPU (the flags
        include -march=native, so a cache shared by machines keeps one object per kind of CPU)."""
        compiler = shutil.which(self.compiler)
        if compiler is None:
            raise BuildError(f"no C++ compiler '{self.compiler}' on PATH (set CXX) to build the kernel")
        host = " ".join([platform.machine(), *sorted(host_flags())])
        key = hashlib.sha256("\0".join([self.source, *self.flags, *self.libs, compiler, host]).encode()).hexdigest()[:16]
        directory = cache_dir / f"{self.result.workload_key}-{self.result.target.fingerprint}"
        library = directory / f"{self.entry_point}-{key}.so"
        if library.exists():
            try:
                os.utime(library)  # used now: the last to be evicted
            except OSError:
                pass
            return library
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BuildError(f"cannot create the kernel cache {directory}: {e.strerror}") from None
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            src = Path(tmp) / "kernel.cc"
            src.write_text(self.source)
            built = Path(tmp) / "kernel.so"
            cmd = [compiler, *self.flags, "-shared", "-fPIC", str(src), "-o", str(built), *self.libs]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  preexec_fn=lowest_priority if self._background else None)
            if proc.returncode != 0:
                raise BuildError(f"building the kernel failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
            os.replace(built, library)  # atomic: concurrent builders agree on the file
        _evict(cache_dir, keep=library)
        return library

    def __call__(self, *args: Any, out: Any = None, num_threads: Optional[int] = None) -> Any:
        """Runs the kernel on NumPy arrays or contiguous PyTorch CPU tensors, in declaration order."""
        return self._call_prepared(None, args, out, num_threads)

    def _call_prepared(self, state: Optional[int], args: Sequence[Any], out: Any, num_threads: Optional[int]) -> Any:
        """The call, through fusor_run_prepared with `state` (None: fusor_run); a kernel of a range of sizes at
        the sizes its inputs have."""
        outs = self._check_count(args, out)
        sizes = self.sizes_of(args) if self.ranges else {}
        tensor_type = _torch_tensor_type()
        use_torch = tensor_type is not None and any(isinstance(a, tensor_type) for a in args)
        ins = self._in_array()
        for i, (a, spec) in enumerate(zip(args, self.inputs)):
            ins[i] = self._pointer(a, spec.at(sizes), tensor_type, "input", writable=False)
        if outs is None:
            outs = [self._allocate(spec.at(sizes), use_torch) for spec in self.outputs]
        results = self._out_array()
        for i, (o, spec) in enumerate(zip(outs, self.outputs)):
            results[i] = self._pointer(o, spec.at(sizes), tensor_type, "output", writable=True)
        self._run(state, ins, results, num_threads or self.num_threads, [sizes[name] for name, _, _ in self.ranges])
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _prepare_pointers(self, inputs: Sequence[int]) -> Optional[int]:
        if self._prepare_fns is None:
            return None
        state = self._prepare_fns[0](self._in_array(*inputs))
        if not state:
            raise FusorError(f"{self._what()} could not prepare its constant inputs (out of memory)")
        return int(state)

    def _run_prepared(self, state: int, inputs: Sequence[int], outputs: Sequence[int], dims: Sequence[int] = ()) -> None:
        self._run(state, self._in_array(*inputs), self._out_array(*outputs), self.num_threads, dims)

    def _release_prepared(self, state: int) -> None:
        if self._prepare_fns is not None:
            self._prepare_fns[2](state)

    def run_pointers(self, inputs: Sequence[int], outputs: Sequence[int], *, device: int = 0,
                     stream: Optional[int] = None, dims: Sequence[int] = ()) -> None:
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs):
            raise KernelArgumentError(f"{self._what()} takes {len(self.inputs)} inputs and {len(self.outputs)} outputs")
        self._run(None, self._in_array(*inputs), self._out_array(*outputs), self.num_threads, dims)

    def _allocate(self, spec: TensorSpec, use_torch: bool) -> Any:
        return torch_empty(spec) if use_torch else np.empty(spec.shape, dtype=NUMPY_DTYPES[spec.dtype])

    def _pointer(self, a: Any, spec: TensorSpec, tensor_type: Optional[type], role: str, writable: bool) -> int:
        if isinstance(a, np.ndarray):
            np_dtype = NUMPY_DTYPES[spec.dtype]
            if a.dtype != np_dtype:
                raise KernelArgumentError(f"{role} {spec.name} must be {np_dtype} ({spec.dtype}), got {a.dtype}")
            if a.shape != spec.shape:
                raise KernelArgumentError(f"{role} {spec.name} must have shape {spec.shape}, got {a.shape}")
            if not a.flags.c_contiguous:
                raise KernelArgumentError(f"{role} {spec.name} must be C-contiguous (np.ascontiguousarray)")
            if writable and not a.flags.writeable:
                raise KernelArgumentError(f"output {spec.name} is read-only")
            return a.ctypes.data
        if tensor_type is not None and isinstance(a, tensor_type):
            check_tensor(a, spec, role, "cpu", writable)
            return int(a.data_ptr())  # type: ignore[attr-defined]
        raise KernelArgumentError(f"{role} {spec.name} must be a NumPy array or a PyTorch CPU tensor, "
                                  f"got {type(a).__name__}")
