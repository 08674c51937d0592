"""PyTorch helpers: attention and GEMM chains on tensors, run by kernels fusor tuned.

Each helper writes the chain its tensors' shapes and dtype describe, asks the
scheduler for its tuned kernel (the scheduler's cache first, tuning on a
miss), keeps the kernel for the rest of the process, and runs it. CPU tensors
run on a CPU target, CUDA tensors on a CUDA target. The kernels compute
forward passes only: call them under ``torch.no_grad()`` or
``torch.inference_mode()``.

The client is the one given to :func:`set_client`, else one of the scheduler
at $FUSOR_SERVER (with $FUSOR_TOKEN), else an embedded scheduler and worker
started on first use and stopped at exit.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .._chain import Chain
from .._client import Client
from .._errors import KernelArgumentError
from .._kernel import Kernel
from .._quiet import Requests
from .._result import Explanation
from .. import _strided
from .._strided import ACTIVATIONS, View, strided_access

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# A bool mask's "do not attend" as an additive term: far below any score, and finite in the dtype.
_MASKED = {"f32": -1e9, "f16": -1e4, "bf16": -1e9}

_lock = threading.Lock()  # guards the three below, never held while tuning or starting a service
_starting = threading.Lock()  # one default client started at a time
_client: Optional[Client] = None
_owned = False  # whether _client was started here (and so is closed here)
_kernels: Dict[Tuple[str, str, Tuple[str, ...]], Kernel] = {}
_pending: Dict[Tuple[str, str, Tuple[str, ...]], threading.Lock] = {}


def set_client(client: Optional[Client]) -> None:
    """The client the helpers use (None: back to the default); forgets the kernels kept so far, and stops the
    default embedded scheduler if the helpers had started one."""
    global _client, _owned
    with _lock:
        previous, owned = _client, _owned
        _client, _owned = client, False
        _kernels.clear()
    if owned and previous is not None:
        previous.close()


# How the default embedded service tunes beside the process's requests (set_tuning_cores).
_worker_cores: Optional[int] = None


def set_tuning_cores(cores: Optional[int]) -> None:
    """The cores the default embedded worker may use (None: all), for the one started after this call."""
    global _worker_cores
    _worker_cores = cores


def _default_client() -> Client:
    global _client, _owned
    with _lock:
        if _client is not None:
            return _client
    # Started outside _lock: requests go on (requests() takes it) while the service starts and calibrates.
    with _starting:
        with _lock:
            if _client is not None:
                return _client
        server = os.environ.get("FUSOR_SERVER")
        # On this machine, the worker tunes in what the requests leave and times between them.
        started = Client(server) if server else Client.embedded(serving=True, worker_cores=_worker_cores)
        with _lock:
            if _client is None:
                _client, _owned = started, True
                return started
            chosen = _client  # set_client() gave one meanwhile
    started.close()
    return chosen


def requests() -> Optional[Requests]:
    """The request counters of the default embedded service, once started (None: none, or a remote server)."""
    with _lock:
        return _client.requests if _client is not None else None


def kernel(chain: Chain, backend: str, budget: int = 0, vary: Sequence[str] = ()) -> Kernel:
    """The tuned kernel of `chain` on `backend`, kept for the process after the first call. Threads asking for
    the same chain wait for one compile; other chains go on. With `vary` (the dims whose size changes from call
    to call), the kernel of the range of sizes around the chain's, which takes them at each call: on a miss the
    scheduler carries over the schedule of the same chain at other sizes where it has one (validated and timed
    at these: seconds), else tunes."""
    key = (chain.text, backend, tuple(vary))
    with _lock:
        if key in _kernels:
            return _kernels[key]
        pending = _pending.setdefault(key, threading.Lock())
    with pending:
        with _lock:
            if key in _kernels:
                return _kernels[key]
        compiled = _default_client().compile(chain, backend=backend, budget=budget, vary=vary, transfer=bool(vary),
                                             background=True)
        with _lock:
            _kernels[key] = compiled
            _pending.pop(key, None)
        return compiled


def refine(chain: Chain, backend: str, budget: int, vary: Sequence[str]) -> Kernel:
    """Tunes `chain`'s range again (its record was carried over from other sizes) and returns its best kernel
    now: the tune's, when it measured faster."""
    client = _default_client()
    client.tune(chain, backend=backend, budget=budget, vary=vary, force=True)
    compiled = client.compile(chain, backend=backend, cache_only=True, vary=vary, background=True)
    with _lock:
        _kernels[(chain.text, backend, tuple(vary))] = compiled
    return compiled


def explain(chain: Chain, backend: str, vary: Sequence[str] = ()) -> Explanation:
    """Why the scheduler has no record of `chain`'s own (Client.explain)."""
    return _default_client().explain(chain, backend=backend, vary=vary)


def _check(tensors: List[torch.Tensor], names: List[str]) -> Tuple[str, str]:
    """The chain dtype and backend of the tensors, which must agree."""
    first = tensors[0]
    if first.dtype not in _DTYPES:
        raise KernelArgumentError(f"{names[0]} is {first.dtype}; fusor kernels take float32, float16 or bfloat16")
    for name, t in zip(names, tensors):
        if t.dtype != first.dtype:
            raise KernelArgumentError(f"{name} is {t.dtype}, {names[0]} is {first.dtype}: they must agree")
        if t.device != first.device:
            raise KernelArgumentError(f"{name} is on {t.device}, {names[0]} on {first.device}: they must agree")
        if t.requires_grad and torch.is_grad_enabled():
            raise KernelArgumentError(f"{name} requires grad: fusor kernels compute forward passes only "
                                      "(use torch.no_grad() or torch.inference_mode())")
    if first.device.type not in ("cpu", "cuda"):
        raise KernelArgumentError(f"tensors on {first.device}: fusor kernels run on the CPU or a CUDA GPU")
    return _DTYPES[first.dtype], first.device.type


def _read_in_place(t: torch.Tensor, names: List[str]) -> torch.Tensor:
    """`t`, or a contiguous copy of it where no chain can read its strides in place."""
    return t if strided_access(t.shape, t.stride(), names) is not None else t.contiguous()


def _run(text: str, backend: str, budget: int, inputs: List[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    compiled = kernel(Chain.parse(text), backend, budget)
    compiled.run_pointers([t.data_ptr() for t in inputs], [out.data_ptr()], device=out.device.index or 0)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None,
              scale: Optional[float] = None, *, is_causal: bool = False, budget: int = 0) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v, fused into one tuned kernel that reads the tensors where they lie
    (head views, transposes and broadcast masks are not copied).

    Args:
        q: [..., M, D] queries; k: [..., N, D] keys; v: [..., N, Dv] values, with the same leading (batch,
            head) dims.
        mask: an additive float mask broadcastable to [..., M, N] (e.g. BERT's [B, 1, 1, N]), or a boolean
            one (True: attend), or None.
        scale: default 1/sqrt(D).
        is_causal: query m attends to keys n <= m only (as SDPA's ``is_causal``); the kernel skips the
            blocks past the diagonal.
        budget: candidates measured when the chain is tuned first.
    """
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise KernelArgumentError(f"q, k and v must have the same rank (at least 2), got {q.dim()}, {k.dim()}, {v.dim()}")
    *batch, m, d = q.shape
    n, dv = k.shape[-2], v.shape[-1]
    if tuple(k.shape) != (*batch, n, d) or tuple(v.shape) != (*batch, n, dv):
        raise KernelArgumentError(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                                  "(want [..., M, D], [..., N, D], [..., N, Dv])")
    dtype, backend = _check([q, k, v], ["q", "k", "v"])
    names = [f"z{i}" for i in range(len(batch))]
    q, k, v = (_read_in_place(t, names + ["a", "b"]) for t in (q, k, v))
    inputs = [q, k, v]
    if mask is not None:
        if mask.dim() > q.dim() or all(s == 1 for s in mask.shape):
            raise KernelArgumentError(f"mask {tuple(mask.shape)} does not broadcast to the scores {(*batch, m, n)} "
                                      "(a mask of size-1 axes only is a constant: fold it into the scale)")
        if mask.dtype == torch.bool:
            mask = torch.zeros((), dtype=q.dtype, device=mask.device).masked_fill(~mask, _MASKED[dtype])
        try:
            mask = mask.to(device=q.device, dtype=q.dtype).expand(*batch, m, n)
        except RuntimeError:
            raise KernelArgumentError(f"mask {tuple(mask.shape)} does not broadcast to the scores {(*batch, m, n)}") from None
        mask = _read_in_place(mask, names + ["m", "n"])
        inputs.append(mask)
    written = _strided.attention(View.of(q), View.of(k), View.of(v), None if mask is None else View.of(mask),
                                1.0 / math.sqrt(d) if scale is None else scale, dtype, range(q.dim()),
                                causal=0 if is_causal else None)
    return _run(written, backend, budget, inputs, q.new_empty((*batch, m, dv)))


def gemm_chain(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, bias: Optional[torch.Tensor] = None,
               activation: Optional[str] = None, *, budget: int = 0) -> torch.Tensor:
    """act(x @ w1 + bias) @ w2 (a feed-forward block), fused into one tuned kernel that reads the tensors
    where they lie.

    Args:
        x: [..., C]; w1: [C, F]; w2: [F, O]. An ``nn.Linear``'s weight is [out, in]: pass ``weight.t()``, a
            view the kernel reads as stored (nothing is copied).
        bias: [F] or None. activation: None, "relu", "gelu" (erf), "gelu_tanh", "tanh", "sigmoid" or "silu".
    """
    if activation is not None and activation not in ACTIVATIONS:
        raise KernelArgumentError(f"activation '{activation}' is not one of {', '.join(ACTIVATIONS)}")
    if x.dim() < 1 or w1.dim() != 2 or w2.dim() != 2 or w1.shape[0] != x.shape[-1] or w2.shape[0] != w1.shape[1]:
        raise KernelArgumentError(f"shapes do not chain: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)} "
                                  "(want [..., C], [C, F], [F, O])")
    if bias is not None and tuple(bias.shape) != (w1.shape[1],):
        raise KernelArgumentError(f"bias must be [{w1.shape[1]}], got {tuple(bias.shape)}")
    tensors = [x, w1, w2] + ([bias] if bias is not None else [])
    dtype, backend = _check(tensors, ["x", "w1", "w2", "bias"])
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    w1, w2 = _read_in_place(w1, ["c", "f"]), _read_in_place(w2, ["f", "o"])
    rows = _read_in_place(rows, ["m", "c"])
    bias = None if bias is None else bias.contiguous()
    written = _strided.ffn(View.of(rows), View.of(w1), View.of(w2), dtype, activation, b1=bias is not None)
    inputs = [rows, w1] + ([bias] if bias is not None else []) + [w2]
    y = _run(written, backend, budget, inputs, x.new_empty((rows.shape[0], w2.shape[1])))
    return y.reshape(*lead, w2.shape[1])
