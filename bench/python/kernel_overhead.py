"""What a fusor.Kernel call costs over the raw kernel, measured side by side in one process.

    python bench/python/kernel_overhead.py [--server HOST:PORT] [--rounds 15] [--calls 2000]

It tunes (or finds in the cache) a small GEMM chain whose kernel runs in microseconds, then times, in
alternating rounds, the same shared object called
  raw      from a C loop (clock_gettime around `calls` calls of fusor_run),
  ctypes   through ctypes with argument arrays made once,
  Kernel   through fusor.Kernel with out= given, and
  Kernel+  through fusor.Kernel allocating its output, and
  torch    through fusor.Kernel on PyTorch CPU tensors with out= given (when PyTorch is installed),
all on one thread, and prints the median time per call of each and the overhead over raw.
"""

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import fusor

CHAIN = """
chain overhead_gemm_chain
dtype f32
dim m=16 k=16 n=16 h=16
in  A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
"""

HARNESS = r"""
#include <time.h>
typedef int (*run_fn)(const void* const*, void* const*, int);
double fusor_time_calls(void* fn, const void* const* in, void* const* out, int threads, int calls) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < calls; ++i) ((run_fn)fn)(in, out, threads);
  clock_gettime(CLOCK_MONOTONIC, &b);
  return ((b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec)) / calls;
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="scheduler address (default: an embedded scheduler and worker)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and way")
    args = parser.parse_args()

    client = fusor.Client(args.server) if args.server else fusor.Client.embedded()
    with client, tempfile.TemporaryDirectory() as tmp:
        kernel = client.compile(CHAIN, budget=4)
        harness = Path(tmp) / "harness.so"
        (Path(tmp) / "harness.c").write_text(HARNESS)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(Path(tmp) / "harness.c"), "-o", str(harness)], check=True)
        time_calls = ctypes.CDLL(str(harness)).fusor_time_calls
        time_calls.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        time_calls.restype = ctypes.c_double

        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(s.shape, dtype=np.float32) for s in kernel.inputs]
        output = np.empty(kernel.outputs[0].shape, np.float32)
        ins = (ctypes.c_void_p * len(inputs))(*[a.ctypes.data for a in inputs])
        outs = (ctypes.c_void_p * 1)(output.ctypes.data)
        fn = kernel._fn
        fn_address = ctypes.cast(fn, ctypes.c_void_p).value

        def raw() -> float:
            return time_calls(fn_address, ins, outs, 1, args.calls)

        def timed(call) -> float:
            started = time.perf_counter()
            for _ in range(args.calls):
                call()
            return (time.perf_counter() - started) / args.calls

        ways = {
            "raw": raw,
            "ctypes": lambda: timed(lambda: fn(ins, outs, 1)),
            "Kernel": lambda: timed(lambda: kernel(*inputs, out=output, num_threads=1)),
            "Kernel+": lambda: timed(lambda: kernel(*inputs, num_threads=1)),
        }
        try:
            import torch

            tensors = [torch.from_numpy(a) for a in inputs]
            out_tensor = torch.from_numpy(output)
            ways["torch"] = lambda: timed(lambda: kernel(*tensors, out=out_tensor, num_threads=1))
        except ImportError:
            pass
        samples = {name: [] for name in ways}
        for name, way in ways.items():  # warm up
            way()
        for _ in range(args.rounds):
            for name, way in ways.items():
                samples[name].append(way())

    raw_median = statistics.median(samples["raw"])
    print(f"kernel {kernel.result.schedule!r}, {args.rounds} rounds of {args.calls} calls, one thread")
    print(f"{'way':<8} {'median':>10} {'p10-p90':>19} {'over raw':>10}")
    for name, values in samples.items():
        values.sort()
        p10, p90 = values[len(values) // 10], values[(len(values) * 9) // 10]
        med = statistics.median(values)
        print(f"{name:<8} {med * 1e6:8.2f}us {p10 * 1e6:8.2f}-{p90 * 1e6:7.2f}us {(med - raw_median) * 1e6:8.2f}us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
