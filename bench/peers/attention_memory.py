#!/usr/bin/env python3
"""Peak memory of one attention call: fusor's tuned kernel, PyTorch SDPA and
onnxruntime's MultiHeadAttention, each in a fresh process.

For an attention chain file of the plain form (Q[b,m,k] K[b,n,k] V[b,n,h],
optionally an additive key mask M[n]; b is the heads of one sequence), each
implementation runs once in a child process of its own; what the call adds to
the process's peak resident set (ru_maxrss after the call less before it, the
inputs already allocated and touched) is printed, next to the inputs' and
the output's own size: fusor writes into an output already resident, SDPA and
onnxruntime allocate theirs in the call. fusor's kernel comes from `fusor compile` (the
database given, tuning on a miss) and its metadata's scratch bytes per thread
are printed too.

  bench/peers/attention_memory.py --db FRESH.db bench/chains/attention_h4_d64_s8192.fusor

Needs numpy, PyTorch and onnxruntime (the environment of deploy/peers-env.sh --torch).
"""

import argparse
import ctypes
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_chain(path):
    text = open(path).read()
    dims = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", re.search(r"^dim (.*)$", text, re.M).group(1))}
    dtype = re.search(r"^dtype (\w+)", text, re.M).group(1)
    return dims, dtype, " M[n]" in text


def peak_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def fusor_call(args, path, dims, masked, inputs, output):
    """The kernel `fusor compile` hands out, built as its metadata says."""
    work = tempfile.mkdtemp(prefix="fusor-memory-")
    subprocess.run([args.fusor, "--db", args.db, "compile", path, "-o", work], check=True, stdout=subprocess.DEVNULL)
    source = [f for f in os.listdir(work) if f.endswith(".cc")][0]
    meta = json.load(open(os.path.join(work, source[:-3] + ".json")))
    kmeta = meta.get("kernel", meta)
    so = os.path.join(work, "kernel.so")
    libs = ["-l" + lib for lib in kmeta.get("link_libs", [])]
    subprocess.run(["c++"] + kmeta["compile_flags"] + ["-shared", "-fPIC", "-o", so, os.path.join(work, source)] + libs,
                   check=True)
    fn = ctypes.CDLL(so)["fusor_run"]
    ins = (ctypes.c_void_p * len(inputs))(*[a.ctypes.data for a in inputs])
    outs = (ctypes.c_void_p * 1)(output.ctypes.data)
    scratch = re.search(r"scratch per thread: (\d+) bytes", open(os.path.join(work, source)).read())
    note = f"scratch {int(scratch.group(1)) / 2**20:.1f} MiB per thread" if scratch else ""
    return (lambda: fn(ins, outs, args.threads)), note


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
        call, note = fusor_call(args, args.chain, dims, masked, inputs, output)
    elif args.impl == "sdpa":
        import torch
        torch.set_num_threads(args.threads)
        tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        q, kk, v = (torch.from_numpy(a).to(tdtype).unsqueeze(0) for a in f32[:3])
        mask = torch.from_numpy(f32[3]).to(tdtype).view(1, n) if masked else None
        scale = 1 / k ** 0.5
        call = lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, v, attn_mask=mask, scale=scale)
    else:
        import onnx
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
    before = peak_kib()
    call()
    print(json.dumps({"impl": args.impl, "added_mib": (peak_kib() - before) / 1024,
                      "in_mib": sum(a.nbytes for a in f32) / 2**20, "out_mib": b * m * h * 4 / 2**20, "note": note}))


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
            print(f"  {impl}: +{r['added_mib']:.1f} MiB (inputs {r['in_mib']:.1f} MiB, f32 output {r['out_mib']:.1f} MiB"
                  f"{', written in place' if impl == 'fusor' else ', allocated by the call'}) {r['note']}")


if __name__ == "__main__":
    main()
