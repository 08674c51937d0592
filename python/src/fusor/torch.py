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
from typing import Dict, List, Optional, Tuple

import torch

from ._chain import Chain
from ._client import Client
from ._errors import KernelArgumentError
from ._kernel import Kernel

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "tanh", "sigmoid")

_lock = threading.Lock()  # guards the three below, never held while tuning
_client: Optional[Client] = None
_owned = False  # whether _client was started here (and so is closed here)
_kernels: Dict[Tuple[str, str], Kernel] = {}
_pending: Dict[Tuple[str, str], threading.Lock] = {}


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


def _default_client() -> Client:
    global _client, _owned
    with _lock:
        if _client is None:
            server = os.environ.get("FUSOR_SERVER")
            _client, _owned = Client(server) if server else Client.embedded(), True
        return _client


def kernel(chain: Chain, backend: str, budget: int = 0) -> Kernel:
    """The tuned kernel of `chain` on `backend`, kept for the process after the first call. Threads asking for
    the same chain wait for one compile; other chains go on."""
    key = (chain.text, backend)
    with _lock:
        if key in _kernels:
            return _kernels[key]
        pending = _pending.setdefault(key, threading.Lock())
    with pending:
        with _lock:
            if key in _kernels:
                return _kernels[key]
        compiled = _default_client().compile(chain, backend=backend, budget=budget)
        with _lock:
            _kernels[key] = compiled
            _pending.pop(key, None)
        return compiled


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


def _number(x: float) -> str:
    return repr(float(x)) if float(x) == int(x) else f"{x:.9g}"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None,
              scale: Optional[float] = None, *, budget: int = 0) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v, fused into one tuned kernel.

    Args:
        q: [..., M, D] queries; k: [..., N, D] keys; v: [..., N, Dv] values, with the same leading (batch,
            head) dims.
        mask: an additive float mask broadcastable to [..., M, N] (e.g. BERT's [B, 1, 1, N]), or a boolean
            one (True: attend), or None.
        scale: default 1/sqrt(D).
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
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    bdims = [f"z{i}" for i in range(len(batch))]
    extents = dict(zip(bdims, batch), m=m, n=n, k=d, h=dv)
    inputs = [q.contiguous(), k.contiguous(), v.contiguous()]
    decl = [f"Q[{','.join(bdims + ['m', 'k'])}]", f"K[{','.join(bdims + ['n', 'k'])}]",
            f"V[{','.join(bdims + ['n', 'h'])}]"]
    scores = ",".join(bdims + ["m", "n"])
    softmax_expr = f"S[{scores}]"
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = torch.zeros((), dtype=q.dtype, device=mask.device).masked_fill(~mask, -1e4 if dtype == "f16" else -1e9)
        axes, kept = _broadcast_axes(tuple(mask.shape), bdims + ["m", "n"], [*batch, m, n])
        inputs.append(mask.to(device=q.device, dtype=q.dtype).reshape(kept).contiguous())
        decl.append(f"M[{','.join(axes)}]")
        softmax_expr += f" + M[{','.join(axes)}]"
    b = ",".join(bdims)
    sep = "," if bdims else ""
    text = "\n".join([
        "chain fusor_attention",
        f"dtype {dtype}",
        "dim " + " ".join(f"{name}={extent}" for name, extent in extents.items()),
        "in  " + " ".join(decl),
        f"S[{scores}] = sum(k) Q[{b}{sep}m,k] * K[{b}{sep}n,k] * {_number(scale)}",
        f"P[{scores}] = softmax(n) {softmax_expr}",
        f"O[{b}{sep}m,h] = sum(n) P[{scores}] * V[{b}{sep}n,h]",
        "out O", ""])
    return kernel(Chain.parse(text), backend, budget)(*inputs)


def _broadcast_axes(shape: Tuple[int, ...], dims: List[str], extents: List[int]) -> Tuple[List[str], List[int]]:
    """The dims a mask of `shape` runs along (aligned at the last axis; size-1 axes broadcast), and its shape
    without the broadcast axes."""
    if len(shape) > len(dims):
        raise KernelArgumentError(f"mask {shape} has more axes than the scores {tuple(extents)}")
    axes, kept = [], []
    offset = len(dims) - len(shape)
    for i, size in enumerate(shape):
        if size == extents[offset + i] and size != 1:
            axes.append(dims[offset + i])
            kept.append(size)
        elif size != 1:
            raise KernelArgumentError(f"mask {shape} does not broadcast to the scores {tuple(extents)}")
    if not axes:
        raise KernelArgumentError("a mask of size-1 axes only is a constant: fold it into the scale or leave it out")
    return axes, kept


def gemm_chain(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, bias: Optional[torch.Tensor] = None,
               activation: Optional[str] = None, *, budget: int = 0) -> torch.Tensor:
    """act(x @ w1 + bias) @ w2 (a feed-forward block), fused into one tuned kernel.

    Args:
        x: [..., C]; w1: [C, F]; w2: [F, O] (an ``nn.Linear``'s weight is [out, in]: pass ``weight.t()``).
        bias: [F] or None. activation: None, "relu", "gelu" (erf), "gelu_tanh", "tanh" or "sigmoid".
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
    m = math.prod(lead)
    c, f, o = x.shape[-1], w1.shape[1], w2.shape[1]
    lines = ["chain fusor_gemm_chain", f"dtype {dtype}", f"dim m={m} c={c} f={f} o={o}",
             "in  X[m,c] W1[c,f] W2[f,o]" + (" B1[f]" if bias is not None else ""),
             "H[m,f] = sum(c) X[m,c] * W1[c,f]"]
    hidden = "H"
    if bias is not None or activation is not None:
        expr = "H[m,f]" + (" + B1[f]" if bias is not None else "")
        lines.append(f"G[m,f] = {activation}({expr})" if activation else f"G[m,f] = {expr}")
        hidden = "G"
    lines += [f"Y[m,o] = sum(f) {hidden}[m,f] * W2[f,o]", "out Y", ""]
    inputs = [x.reshape(m, c).contiguous(), w1.contiguous(), w2.contiguous()]
    if bias is not None:
        inputs.append(bias.contiguous())
    y = kernel(Chain.parse("\n".join(lines)), backend, budget)(*inputs)
    return y.reshape(*lead, o)
