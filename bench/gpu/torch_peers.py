#!/usr/bin/env python3
"""PyTorch peers for the GPU device check: the same chains run the way a
PyTorch user would write them (a matmul chain; for attention also
scaled_dot_product_attention, on its flash path where it applies), timed
like fusor's kernels: CUDA events after warm-up, the L2 flushed before every
run, the median kept.

Prints one line per chain:
  TORCH chain=<name> matmul_us=<t> sdpa_us=<t|-1> sdpa=<flash|default|->

    torch_peers.py CHAIN_FILE...               on the GPU
    torch_peers.py --cpu-check CHAIN_FILE...   no GPU: builds every peer on the CPU, small shapes
"""
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
DEVICE = "cuda"


def parse(path):
    """The chain's name, dtype, dims, input shapes (index strings) and op lines."""
    text = Path(path).read_text()
    name = re.search(r"^chain\s+(\S+)", text, re.M).group(1)
    dtype = re.search(r"^dtype\s+(\S+)", text, re.M)
    dims = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", re.search(r"^dim\s+(.*)$", text, re.M).group(1)))
    inputs = dict(re.findall(r"(\w+)\[([\w,]+)\]", re.search(r"^in\s+(.*)$", text, re.M).group(1)))
    ops = [line for line in text.splitlines() if re.match(r"^\w+\[[\w,]+\]\s*=", line)]
    return name, DTYPES[dtype.group(1) if dtype else "f32"], dims, {k: v.split(",") for k, v in inputs.items()}, ops


def timed(fn, seconds=0.2):
    flush = torch.empty(int(2 * 64 << 20), dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    while len(samples) < 10 or (sum(samples) < seconds * 1e3 and len(samples) < 1000):
        flush.zero_()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop))
    return statistics.median(samples) * 1e3  # microseconds


def attention(dtype, d, inputs, ops, rand):
    """Q K^T (scaled, plus an additive mask), softmax, times V: as einsum
    over the chain's own indices (batched matmuls), and as SDPA on its
    flash path where it applies (f16/bf16, no mask)."""
    names = list(inputs)
    q_name, k_name, v_name = names[:3]
    mask_name = names[3] if len(names) > 3 else None
    t = {n: rand(*[d[i] for i in idx]) for n, idx in inputs.items() if n != mask_name}
    scores_line = ops[0]
    s_idx = re.match(r"^\w+\[([\w,]+)\]", scores_line).group(1).split(",")
    scale = re.search(r"\*\s*([0-9.eE+-]+)\s*$", scores_line)
    scale = float(scale.group(1)) if scale else 1.0
    mask = None
    if mask_name:
        m_idx = inputs[mask_name]
        # M's constant indices (a 0 for a broadcast dim) have extent 1.
        mask = rand(*[d.get(i, 1) for i in m_idx])
    o_idx = re.match(r"^\w+\[([\w,]+)\]", ops[-1]).group(1).split(",")
    q, k, v = t[q_name], t[k_name], t[v_name]
    first = f"{''.join(inputs[q_name])},{''.join(inputs[k_name])}->{''.join(s_idx)}"
    second = f"{''.join(s_idx)},{''.join(inputs[v_name])}->{''.join(o_idx)}"

    def chain():
        s = torch.einsum(first, q, k) * scale
        if mask is not None:
            s = s + mask
        return torch.einsum(second, torch.softmax(s, dim=-1), v)

    # SDPA: (1, heads, length, dim). Grouped-query chains index Q by
    # [..., g, r, m, d] and K, V by [..., g, n, d]: flattened, query head h
    # reads key/value head h // r, as enable_gqa does.
    q4 = q.reshape(1, -1, q.shape[-2], q.shape[-1])
    k4 = k.reshape(1, -1, k.shape[-2], k.shape[-1])
    v4 = v.reshape(1, -1, v.shape[-2], v.shape[-1])
    flash = mask is None and dtype != torch.float32
    kwargs = {"scale": scale, "attn_mask": mask}
    if k4.shape[1] != q4.shape[1]:
        kwargs["enable_gqa"] = True

    def sdpa():
        if flash:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q4, k4, v4, **kwargs)
        return F.scaled_dot_product_attention(q4, k4, v4, **kwargs)

    ref = chain().reshape(1, -1, q.shape[-2], v.shape[-1]).float()
    err = (sdpa().float() - ref).abs().max().item()
    if not err < 0.05:
        raise RuntimeError(f"SDPA disagrees with the matmul chain by {err}")
    return timed(chain), timed(sdpa), "flash" if flash else "default"


def peers(name, dtype, d, inputs, ops):
    g = torch.Generator(device=DEVICE).manual_seed(1)

    def rand(*shape):
        return (torch.rand(*shape, device=DEVICE, generator=g) * 2 - 1).to(dtype)

    torch.backends.cuda.matmul.allow_tf32 = True  # as fusor's f32 kernels (tf32 tensor cores)
    if any("softmax" in op for op in ops):
        return attention(dtype, d, inputs, ops, rand)
    if name == "gemm_chain":
        a, b, dd = rand(d["b"], d["m"], d["k"]), rand(d["b"], d["k"], d["n"]), rand(d["b"], d["n"], d["h"])
        return timed(lambda: torch.bmm(torch.bmm(a, b), dd)), -1, "-"
    if name == "bert_ffn_gelu":
        x, w1, b1, w2 = rand(d["m"], d["c"]), rand(d["c"], d["f"]), rand(d["f"]), rand(d["f"], d["o"])
        return timed(lambda: F.gelu(x @ w1 + b1) @ w2), -1, "-"
    if name.startswith("conv"):
        three = "r" in d
        img = rand(d["n"], d["c"], d["y"] if three else d["p"], d["x"] if three else d["q"])
        w1 = rand(d["k"], d["c"], d["r"], d["s"]) if three else rand(d["k"], d["c"], 1, 1)
        w2 = rand(d["j"], d["k"], 1, 1)
        return timed(lambda: F.conv2d(F.relu(F.conv2d(img, w1)), w2)), -1, "-"
    return -1, -1, "-"


def main():
    global DEVICE, timed
    paths = sys.argv[1:]
    cpu_check = "--cpu-check" in paths
    if cpu_check:
        # Before a GPU is lent: every peer built and SDPA checked against the
        # matmul chain on the CPU, with sequence and batch dims cut down;
        # the times are one untimed-warm-up run each, not a benchmark.
        paths.remove("--cpu-check")
        DEVICE = "cpu"

        def timed(fn, seconds=0):
            fn()
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e6
    elif not torch.cuda.is_available():
        print("TORCH unavailable: no CUDA device")
        return 1
    status = 0
    for path in paths:
        name, dtype, dims, inputs, ops = parse(path)
        if cpu_check:
            dims = {k: min(v, 64) if k in ("m", "n") else min(v, 4) if k in ("b", "g", "r") else v
                    for k, v in dims.items()}
        try:
            matmul_us, sdpa_us, backend = peers(name, dtype, dims, inputs, ops)
        except Exception as e:  # one chain's failure is its own row
            print(f"TORCH chain={name} failed: {type(e).__name__}: {e}", flush=True)
            status = 1
            continue
        print(f"TORCH chain={name} matmul_us={matmul_us:.3f} sdpa_us={sdpa_us:.3f} sdpa={backend} "
              f"torch={torch.__version__}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
