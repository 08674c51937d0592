#!/usr/bin/env python3
"""PyTorch peers for the GPU device check: the same chains as examples/
run the way a PyTorch user would write them (matmul chain; for attention
also scaled_dot_product_attention), timed like fusor's kernels: CUDA events
after warm-up, the L2 flushed before every run, the median kept.

Prints one line per chain: TORCH chain=<name> matmul_us=<t> sdpa_us=<t|-1>
"""
import math
import re
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def dims_and_dtype(path):
    text = Path(path).read_text()
    name = re.search(r"^chain\s+(\S+)", text, re.M).group(1)
    dtype = re.search(r"^dtype\s+(\S+)", text, re.M)
    dims = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", re.search(r"^dim\s+(.*)$", text, re.M).group(1)))
    return name, DTYPES[dtype.group(1) if dtype else "f32"], dims


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


def peers(name, dtype, d):
    g = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape):
        return (torch.rand(*shape, device="cuda", generator=g) * 2 - 1).to(dtype)

    torch.backends.cuda.matmul.allow_tf32 = True  # as fusor's f32 kernels (tf32 tensor cores)
    if name == "gemm_chain":
        a, b, dd = rand(d["b"], d["m"], d["k"]), rand(d["b"], d["k"], d["n"]), rand(d["b"], d["n"], d["h"])
        return timed(lambda: torch.bmm(torch.bmm(a, b), dd)), -1
    if "attention" in name:
        q, k, v = rand(d["b"], d["m"], d["k"]), rand(d["b"], d["n"], d["k"]), rand(d["b"], d["n"], d["h"])
        mask = rand(d["m"], d["n"]) if "f16" in name else None
        scale = 1 / math.sqrt(d["k"])

        def chain():
            s = torch.bmm(q, k.transpose(1, 2)) * scale
            if mask is not None:
                s = s + mask
            return torch.bmm(torch.softmax(s, dim=-1), v)

        sdpa = lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale)
        return timed(chain), timed(sdpa)
    if name == "bert_ffn_gelu":
        x, w1, b1, w2 = rand(d["m"], d["c"]), rand(d["c"], d["f"]), rand(d["f"]), rand(d["f"], d["o"])
        return timed(lambda: F.gelu(x @ w1 + b1) @ w2), -1
    if name.startswith("conv"):
        three = "r" in d
        img = rand(d["n"], d["c"], d["y"] if three else d["p"], d["x"] if three else d["q"])
        w1 = rand(d["k"], d["c"], d["r"], d["s"]) if three else rand(d["k"], d["c"], 1, 1)
        w2 = rand(d["j"], d["k"], 1, 1)
        return timed(lambda: F.conv2d(F.relu(F.conv2d(img, w1)), w2)), -1
    return -1, -1


def main():
    if not torch.cuda.is_available():
        print("TORCH unavailable: no CUDA device")
        return 1
    for path in sys.argv[1:]:
        name, dtype, dims = dims_and_dtype(path)
        matmul_us, sdpa_us = peers(name, dtype, dims)
        print(f"TORCH chain={name} matmul_us={matmul_us:.3f} sdpa_us={sdpa_us:.3f} torch={torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
