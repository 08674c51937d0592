#!/usr/bin/env python3
"""Peak memory of one attention call: fusor's tuned kernel, PyTorch SDPA and
onnxruntime's MultiHeadAttention, each in a fresh process.

For an attention chain file of the plain form (inputs Q[b,m,k] K[b,n,k]
V[b,n,h], optionally an additive key mask M[n]; b is the heads of one
sequence), each implementation runs once in a child process of its own, its
inputs made and the temporaries that made them freed first. What the call adds
to the process's resident set at its peak (VmHWM, reset just before the call,
less VmRSS then) is printed next to the inputs' and the output's size: fusor
writes into an output already resident, SDPA and onnxruntime allocate theirs
in the call. fusor's kernel comes from `fusor compile` (the database given,
tuning on a miss); its metadata's scratch bytes per thread are printed too.

  bench/peers/attention_memory.py --db FRESH.db bench/chains/attention_h4_d64_s8192.fusor

Needs numpy, PyTorch and onnxruntime (the environment of deploy/peers-env.sh --torch) and Linux
(/proc/self/clear_refs).
"""

import argparse
import ctypes
import gc
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fusor_kernel import build_kernel, run_cmd  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_chain(path):
    """(dims, dtype, masked) of a plain attention chain; SystemExit for any other."""
    text = open(path).read()
    dims = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", re.search(r"^dim (.*)$", text, re.M).group(1))}
    dtype = re.search(r"^dtype (\w+)", text, re.M).group(1)
    inputs = re.search(r"^in\s+(.*)$", text, re.M).group(1).split()
    plain = ["Q[b,m,k]", "K[b,n,k]", "V[b,n,h]"]
    if inputs not in (plain, plain + ["M[n]"]):
        raise SystemExit(f"{path}: inputs {' '.join(inputs)}; this measures {' '.join(plain)} [M[n]] only")
    return dims, dtype, len(inputs) == 4


def resident_kib(field):
    """VmRSS or VmHWM of this process, in KiB."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def fusor_call(args, inputs, output):
    """The kernel `fusor compile` hands out, built as its metadata says; (call, note)."""
    work = tempfile.mkdtemp(prefix="fusor-memory-")
    run_cmd([args.fusor, "--db", args.db, "compile", args.chain, "-o", work])
    fn, meta = build_kernel(work)
    ins = (ctypes.c_void_p * len(inputs))(*[a.ctypes.data for a in inputs])
    outs = (ctypes.c_void_p * 1)(output.ctypes.data)
    scratch = meta.get("kernel", meta).get("scratch_bytes_per_thread")
    note = f"scratch {scratch / 2**20:.1f} MiB per thread" if scratch else ""

    def call():
        if fn(ins, outs, args.threads) != 0:
            raise SystemExit("fusor's kernel returned an error")
    return call, note


def run_one(args):
    import numpy as np
    dims, dtype, masked = parse_chain(args.chain)
    b, m, n, k, h = (dims[x] for x in "bmnkh")
    rng = np.random.default_rng(0)
    shapes = [(b, m, k), (b, n, k), (b, n, h)] + ([(n,)] if masked else [])
    f32 = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    note = ""
    if args.impl == "fusor":
        store = (lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)) if dtype == "bf16" else (lambda a: a)
        inputs = [np.ascontiguousarray(store(a)) for a in f32]
        output = np.empty((b, m, h), dtype=inputs[0].dtype)
        output.fill(0)  # touched: the kernel writes into memory already resident
        call, note = fusor_call(args, inputs, output)
        in_bytes, out_bytes = sum(a.nbytes for a in inputs), output.nbytes
    elif args.impl == "sdpa":
        import torch
        torch.set_num_threads(args.threads)
        tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        q, kk, v = (torch.from_numpy(a).to(tdtype).unsqueeze(0) for a in f32[:3])
        mask = torch.from_numpy(f32[3]).to(tdtype).view(1, n) if masked else None
        scale = 1 / k ** 0.5
        call = lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, v, attn_mask=mask, scale=scale)
        in_bytes = sum(t.nbytes for t in (q, kk, v) + ((mask,) if masked else ()))
        out_bytes = b * m * h * q.element_size()
    else:
        import onnxruntime as ort
        from onnx import TensorProto, helper
        if dtype != "f32" or masked:
            print(json.dumps({"impl": args.impl, "skipped": "f32 unmasked only"}))
            return
        node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=b)
        graph = helper.make_graph([node], "mha", [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)
                                                  for x in "qkv"], [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        # [heads, seq, dim] to one sequence of [seq, heads * dim].
        feed = {x: np.ascontiguousarray(a.transpose(1, 0, 2).reshape(1, a.shape[1], -1)) for x, a in zip("qkv", f32)}
        call = lambda: session.run(None, feed)
        in_bytes, out_bytes = sum(a.nbytes for a in feed.values()), b * m * h * 4
    del f32
    gc.collect()
    before = resident_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the current resident set
    call()
    print(json.dumps({"impl": args.impl, "added_mib": (resident_kib("VmHWM") - before) / 1024,
                      "in_mib": in_bytes / 2**20, "out_mib": out_bytes / 2**20, "note": note}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chain")
    p.add_argument("--db", required=True, help="tuning database for `fusor compile`")
    p.add_argument("--fusor", default=os.path.join(ROOT, "build", "client", "fusor"))
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--impl", help=argparse.SUPPRESS)  # the child's one implementation
    args = p.parse_args()
    if args.impl:
        run_one(args)
        return
    print(f"{os.path.basename(args.chain)}: memory one call adds to a fresh process's peak")
    for impl in ("fusor", "sdpa", "onnxruntime"):
        out = subprocess.run([sys.executable, __file__, args.chain, "--db", args.db, "--fusor", args.fusor,
                              "--threads", str(args.threads), "--impl", impl], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  {impl}: failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if "skipped" in r:
            print(f"  {impl}: skipped ({r['skipped']})")
        else:
            print(f"  {impl}: +{r['added_mib']:.1f} MiB (inputs {r['in_mib']:.1f} MiB, output {r['out_mib']:.1f} MiB"
                  f"{', written in place' if impl == 'fusor' else ', allocated by the call'}) {r['note']}")


if __name__ == "__main__":
    main()
