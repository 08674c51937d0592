#!/usr/bin/env python3
"""Serving traffic: a trace of requests whose lengths change from one to the next, as a server sees them.

Each variant runs in a fresh process (and, for fusor, a fresh tuning database): the trace once cold (whatever
the variant compiles or tunes happens while it serves), then, for fusor, `fusor.torch.wait()` for the tunes
still running (timed apart), then the same trace twice: the first pass settles (fusor compares each kernel
that arrived with the ops it replaces, and each graph's variants, at its first call), the second is the warm
total. Every request's output is checked against eager's, and each request is timed alone (wall clock around
the forward pass). Variants: eager, inductor
(`torch.compile`), fusor (`backend="fusor"`, the rest through inductor) and fusor-eager
(`fusor.torch.optimize`: the rest run as is).

    python bench/models/traffic.py --model bert-base --layers 4
    python bench/models/traffic.py --model llama --layers 2 --lengths 12 --repeat 3

Needs torch and transformers from PyPI, and the built fusor binaries (this checkout's build/, FUSOR_BIN_DIR, or
FUSOR_SERVER). Prints one JSON line
per variant, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ["eager", "inductor", "fusor", "fusor-eager"]


def build(model: str, layers: int) -> Any:
    import torch
    import transformers as T

    torch.manual_seed(0)
    if model == "bert-base":
        return T.BertModel(T.BertConfig(num_hidden_layers=layers, attn_implementation="sdpa")).eval()
    if model == "llama":
        config = T.LlamaConfig(hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                               num_key_value_heads=4, intermediate_size=2816, use_cache=False,
                               attn_implementation="sdpa")
        return T.LlamaModel(config).eval()
    raise SystemExit(f"unknown model {model!r}: bert-base or llama")


def trace(lengths: int, lo: int, hi: int, repeat: int, seed: int) -> List[int]:
    """`lengths` distinct lengths spread over [lo, hi], each `repeat` times, shuffled."""
    rng = random.Random(seed)
    step = (hi - lo) / max(1, lengths - 1)
    distinct = sorted({round(lo + i * step) for i in range(lengths)})
    requests = distinct * repeat
    rng.shuffle(requests)
    return requests


def run_variant(args: argparse.Namespace) -> Dict[str, Any]:
    """In this process: one variant, cold then warm, each request checked against eager's output."""
    import torch

    torch.set_num_threads(args.threads)
    model = build(args.model, args.layers)
    requests = trace(args.lengths, args.min, args.max, args.repeat, args.seed)
    feeds = {n: torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n)) for n in set(requests)}
    with torch.inference_mode():
        expected = {n: model(input_ids=ids)[0] for n, ids in feeds.items()}
    if args.variant == "eager":
        fn = model
    elif args.variant == "inductor":
        fn = torch.compile(model)
    else:
        import fusor.torch as ft

        options: Dict[str, Any] = {"budget": args.budget}
        if args.tune_seconds:
            options["tune_seconds"] = args.tune_seconds
        fn = torch.compile(model, backend="fusor", options=options) if args.variant == "fusor" else \
            ft.optimize(model, **options)

    def serve() -> Dict[str, Any]:
        times, errors = [], []
        start = time.perf_counter()
        for n in requests:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = fn(input_ids=feeds[n])[0]
            times.append(time.perf_counter() - t0)
            errors.append(float((out - expected[n]).abs().max()))
        total = time.perf_counter() - start
        ordered = sorted(times)
        return {"total_s": total, "p50_ms": statistics.median(times) * 1e3, "max_ms": ordered[-1] * 1e3,
                "max_error": max(errors)}

    result: Dict[str, Any] = {"variant": args.variant, "requests": len(requests),
                              "lengths": len(set(requests)), "cold": serve()}
    if args.variant.startswith("fusor"):
        import fusor.torch as ft

        t0 = time.perf_counter()
        ft.wait()
        result["wait_s"] = time.perf_counter() - t0
    result["settle"] = serve()
    result["warm"] = serve()
    if args.variant.startswith("fusor"):
        import fusor.torch as ft

        report = ft.report()
        failed = [f"{r['chain']}: {r['reason']}" for r in report if r["state"] == "failed"]
        if failed:  # a run whose tunes failed measures nothing of fusor's
            raise SystemExit("fusor's tunes failed: " + "; ".join(failed))
        result["chains"] = [{k: r[k] for k in ("chain", "state", "answer", "refined", "range", "kernel_us",
                                               "original_us")} for r in report]
        # Searches: the ranges tuned outright, and the transferred ones tuned again since; transfers: the ranges
        # that started from the schedule of other sizes (validated and timed alone).
        result["tunes"] = sum(1 for r in report if r["answer"] == "tuned" or r["refined"])
        result["transfers"] = sum(1 for r in report if r["answer"] == "transferred" or r["refined"])
        result["graphs"] = [g["runs"] for g in ft.graphs()]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert-base", choices=["bert-base", "llama"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lengths", type=int, default=12, help="distinct request lengths")
    ap.add_argument("--min", type=int, default=32)
    ap.add_argument("--max", type=int, default=384)
    ap.add_argument("--repeat", type=int, default=3, help="requests per length")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--budget", type=int, default=0, help="candidates per tune (0: the scheduler's default)")
    ap.add_argument("--tune-seconds", type=float, default=0, help="fusor's tuning budget (0: no cap)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # in the child: the one variant to run
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)), flush=True)
        return
    results = []
    build_dir = REPO / "build"
    if not os.environ.get("FUSOR_SERVER") and build_dir.is_dir():
        os.environ.setdefault("FUSOR_BIN_DIR", str(build_dir))  # the binaries of this checkout
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--variant", variant]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            results.append({"variant": variant, "error": proc.stderr[-2000:]})
            print(json.dumps(results[-1]), flush=True)
            continue
        results.append(json.loads(lines[-1]))
        print(lines[-1], flush=True)
    ok = [r for r in results if "error" not in r]
    peers = [r["warm"]["total_s"] for r in ok if r["variant"] in ("eager", "inductor")]
    eager_cold = next((r["cold"]["total_s"] for r in ok if r["variant"] == "eager"), None)
    print(f"\n{args.model}, {args.layers} layers, f32, batch 1, {len(trace(args.lengths, args.min, args.max, args.repeat, args.seed))} "
          f"requests over {args.lengths} lengths in [{args.min}, {args.max}], {args.threads} threads")
    print(f"{'variant':12} {'cold s':>7} {'x eager':>7} {'p50 ms':>7} {'max ms':>8} {'wait s':>7} {'settle s':>8} "
          f"{'warm s':>7} {'p50 ms':>7} {'max ms':>7} {'x best':>6} {'tunes':>5} {'xfers':>5} {'max err':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['variant']:12} failed: {r['error'].strip().splitlines()[-1] if r['error'].strip() else '?'}")
            continue
        c, settle, w = r["cold"], r["settle"], r["warm"]
        best = min(peers) / w["total_s"] if peers else float("nan")
        cold_x = c["total_s"] / eager_cold if eager_cold else float("nan")
        error = max(c["max_error"], settle["max_error"], w["max_error"])
        print(f"{r['variant']:12} {c['total_s']:7.2f} {cold_x:7.2f} {c['p50_ms']:7.1f} {c['max_ms']:8.1f} "
              f"{r.get('wait_s', 0):7.1f} {settle['total_s']:8.2f} {w['total_s']:7.2f} {w['p50_ms']:7.1f} "
              f"{w['max_ms']:7.1f} {best:6.2f} {r.get('tunes', '-'):>5} {r.get('transfers', '-'):>5} {error:8.1e}")


if __name__ == "__main__":
    main()
