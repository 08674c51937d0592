"""The command line of the Python package: tune, compile, lookup, workers, task and sweep through a scheduler
(--server, default $FUSOR_SERVER or 127.0.0.1:7788), or through a private one with --embedded."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

from ._chain import Chain
from ._client import Client, SweepEntry
from ._errors import FusorError, NotFoundError
from ._result import Progress, Result, Started
from .v1 import scheduler_pb2

EXIT_ERROR, EXIT_MISS = 1, 3  # argparse exits 2 on usage errors


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fusor",
                                description="fusor: fused operator chains, tuned in seconds and shared through one "
                                            "tuning database (the Python client; talks to a scheduler)")
    p.add_argument("--server", default=os.environ.get("FUSOR_SERVER", "127.0.0.1:7788"),
                   help="scheduler address host:port (env FUSOR_SERVER; default %(default)s)")
    p.add_argument("--embedded", action="store_true",
                   help="start a private scheduler and CPU worker instead (needs the built fusor binaries)")
    p.add_argument("--db", help="with --embedded: the tuning database to use and keep (default: a private one)")
    p.add_argument("--token", help="a client-role token (env FUSOR_TOKEN; prefer the env: arguments show in ps)")
    p.add_argument("--tls", action="store_true", help="TLS, verified against the system's roots (or --tls-ca)")
    p.add_argument("--tls-ca", help="PEM CA certificate that signed the scheduler's (implies --tls)")
    p.add_argument("--tls-cert", help="PEM certificate of this side, for mutual TLS")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--tls-server-name", help="name to verify in the scheduler's certificate")
    p.add_argument("--backend", choices=["cpu", "cuda"], default="cpu", help="target backend (default %(default)s)")
    p.add_argument("--target", help="target fingerprint (default: the backend's registered target)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait for an answer (default %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("tune", help="tune chain files (or answer from the cache) and print the results")
    s.add_argument("files", nargs="+", help="chain files (.fusor text or JSON)")
    s.add_argument("--budget", type=int, default=0, help="candidates to measure (default: the scheduler's)")
    s.add_argument("--force", action="store_true", help="tune again even when the cache has an answer")
    s.add_argument("--quiet", action="store_true", help="no progress lines")

    s = sub.add_parser("compile", help="write the best kernel's source and metadata (tuning first on a miss)")
    s.add_argument("file", help="chain file")
    s.add_argument("-o", "--out", default="fusor-out", help="output directory (default %(default)s)")
    s.add_argument("--budget", type=int, default=0, help="candidates to measure when tuning first")
    s.add_argument("--cache-only", action="store_true", help="fail (exit 3) instead of tuning on a cache miss")

    s = sub.add_parser("lookup", help="print cached results only (exit 3 on a miss)")
    s.add_argument("files", nargs="+", help="chain files")

    sub.add_parser("workers", help="list the workers the scheduler knows")

    s = sub.add_parser("task", help="show a tuning task")
    s.add_argument("task_id")

    s = sub.add_parser("sweep", help="tune every chain file given, each distinct chain once, and print the report")
    s.add_argument("files", nargs="+", help="chain files (models of a zoo manifest need the C++ CLI's `fusor sweep`)")
    s.add_argument("--name", default="python", help="the sweep's name")
    s.add_argument("--budget", type=int, default=0, help="candidates per chain")
    return p


def _connect(args: argparse.Namespace) -> Client:
    tls = args.tls_ca or args.tls
    common = dict(token=args.token, tls=tls, tls_cert=args.tls_cert, tls_key=args.tls_key,
                  tls_server_name=args.tls_server_name, timeout=args.timeout)
    if args.embedded:
        return Client.embedded(db=args.db, **common)
    return Client(args.server, **common)


def _print_progress(event: object) -> None:
    if isinstance(event, Started):
        print(f"task {event.task_id}: {event.space_after_pruning} of {event.space_size} schedules after pruning, "
              f"budget {event.budget}", file=sys.stderr)
    elif isinstance(event, Progress):
        best = f", best {event.best_s * 1e6:.1f} us ({event.best_schedule})" if event.best_s > 0 else ""
        print(f"  {event.measured}/{event.budget} measured, {event.failed} failed{best}", file=sys.stderr)


def _run(args: argparse.Namespace, client: Client) -> int:
    target = dict(backend=args.backend, target=args.target)
    if args.command == "tune":
        for f in args.files:
            progress = None if args.quiet else _print_progress
            print(client.tune(Chain.from_file(f), budget=args.budget, force=args.force, progress=progress, **target))
        return 0
    if args.command == "compile":
        response = client.compile_source(Chain.from_file(args.file), budget=args.budget, cache_only=args.cache_only,
                                         **target)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = Path(args.file).stem
        source = out / f"{name}{'.cu' if response.language == 'cuda' else '.cc'}"
        source.write_text(response.kernel_source)
        meta = json.loads(response.metadata_json or "{}")
        r = response.result
        meta.update(workload_key=r.workload_key, target_fingerprint=r.target.fingerprint,
                    measured_median_s=r.best_measurement.median_s, baseline_median_s=r.baseline_s,
                    baseline_kind=r.baseline_kind, speedup=r.speedup, from_cache=r.from_cache)
        (out / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")
        written = [source, out / f"{name}.json"]
        if response.binary:
            written.append(out / f"{name}.{response.binary_format}")
            written[-1].write_bytes(response.binary)
        print(Result.from_proto(r))
        print("wrote      " + "\n           ".join(str(w) for w in written))
        return 0
    if args.command == "lookup":
        rc = 0
        for f in args.files:
            result = client.lookup(Chain.from_file(f), **target)
            if result is None:
                print(f"{f}: not in the cache for this target", file=sys.stderr)
                rc = EXIT_MISS
            else:
                print(result)
        return rc
    if args.command == "workers":
        workers = client.workers()
        if not workers:
            print("no workers")
        for w in workers:
            print(f"{w.worker_id}  {w.name:<20} {w.state:<6} {w.target_fingerprint}  {w.arch}  {w.device_name}  "
                  f"jobs {w.jobs_done}")
        return 0
    if args.command == "task":
        t = client.task(args.task_id)
        p = t.progress
        print(f"task       {t.task_id} ({t.state})\nworkload   {t.workload_key}\ntarget     {t.target_fingerprint}\n"
              f"progress   {p.measured}/{p.budget} measured, {p.failed} failed")
        if t.error:
            print(f"error      {t.error}")
        if t.result is not None:
            print(t.result)
        return 0 if t.state != "failed" else EXIT_ERROR
    if args.command == "sweep":
        def progress(event: object) -> None:
            if isinstance(event, scheduler_pb2.SweepProgress):
                print(f"  {event.done}/{event.chains} chains done ({event.cache_hits} from the cache, "
                      f"{event.failed} failed), {event.elapsed_s:.0f} s", file=sys.stderr)

        entries = [SweepEntry(Chain.from_file(f), model=Path(f).stem, source=f) for f in args.files]
        report = client.sweep(entries, name=args.name, budget=args.budget, progress=progress, **target)
        print(f"sweep {report.sweep_id} ({report.state}) on {report.target.fingerprint}")
        for r in report.results:
            speedup = f"{r.speedup:.2f}x" if r.speedup > 0 else "-"
            print(f"  {r.model:<28} {r.state:<7} best {r.best_s * 1e6:10.1f} us  speedup {speedup:>6}  {r.schedule}"
                  + (f"  ({r.error})" if r.error else ""))
        return 0 if all(r.state != "failed" for r in report.results) else EXIT_ERROR
    raise AssertionError(args.command)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with _connect(args) as client:
            return _run(args, client)
    except NotFoundError as e:
        print(f"fusor: {e}", file=sys.stderr)
        return EXIT_MISS
    except (FusorError, OSError) as e:
        print(f"fusor: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
