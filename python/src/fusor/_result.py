"""What the scheduler answers, as Python objects (each keeps its proto as ``.proto``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from .v1 import scheduler_pb2, target_pb2


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


@dataclass
class Result:
    """A tuning result: the best kernel's schedule and measurement, against the unfused baseline."""

    workload_key: str
    target: target_pb2.Target
    task_id: str
    from_cache: bool
    schedule: str
    mapping: str
    predicted_s: float
    best_s: float
    spread: float
    baseline_s: float
    baseline_kind: str
    speedup: float
    fused_s: float
    fused_schedule: str
    candidates_measured: int
    candidates_failed: int
    tuning_s: float
    # How the answer was found: "tuned" (the workload's own record), "covered" (a record of a range of sizes of
    # the same chain that holds these) or "transferred" (the nearest record's schedule, fitted to these sizes;
    # `validated` once a task measured it here). `source_key`: the record it came from. `served_dims`: the
    # ranged dims the kernel takes at each call ("m=65..256 n=65..256"; "" for exact sizes). `origin`: where the
    # answer was measured when it came from another database ("HOST:DATABASE"; "" for this one's).
    answer: str
    validated: bool
    source_key: str
    served_dims: str
    origin: str
    proto: scheduler_pb2.TuneResult = field(repr=False)

    @classmethod
    def from_proto(cls, r: scheduler_pb2.TuneResult) -> "Result":
        return cls(workload_key=r.workload_key, target=r.target, task_id=r.task_id, from_cache=r.from_cache,
                   schedule=r.best.schedule.text, mapping=r.best.mapping.text,
                   predicted_s=r.best.prediction.t_estm_s, best_s=r.best_measurement.median_s,
                   spread=r.best_measurement.spread, baseline_s=r.baseline_s, baseline_kind=r.baseline_kind,
                   speedup=r.speedup, fused_s=r.fused_s, fused_schedule=r.fused_schedule,
                   candidates_measured=r.candidates_measured,
                   candidates_failed=r.candidates_failed, tuning_s=r.tuning_s, answer=r.answer or "tuned",
                   validated=r.validated or not r.answer, source_key=r.source_key, served_dims=r.served_dims,
                   origin=r.origin, proto=r)

    @property
    def split(self) -> bool:
        """Whether the answer runs the chain in two parts, one after the other, each fused or unfused."""
        return _is_split(self.schedule)

    @property
    def unfused(self) -> bool:
        """Whether the answer runs the chain unfused, through the vendor library (fusion did not pay)."""
        return self.schedule.startswith("unfused ")

    def __str__(self) -> str:
        t = self.target
        answer = ((f"from the cache, imported from {self.origin}" if self.origin else "from the cache")
                  if self.from_cache else
                  f"tuned now by task {self.task_id}: {self.candidates_measured} candidates measured "
                  f"({self.candidates_failed} failed) in {self.tuning_s:.1f} s")
        if self.answer != "tuned":
            answer = (f"{self.answer} from workload {self.source_key}" +
                      ("" if self.validated else " (not yet measured at these sizes)"))
        lines = [f"workload   {self.workload_key}",
                 f"target     {t.fingerprint} ({t.arch}, {t.device_name}, {t.compute_units} "
                 f"{'cores' if t.backend == target_pb2.BACKEND_CPU else 'SMs'})",
                 f"answer     {answer}"] + ([f"range      {self.served_dims}"] if self.served_dims else []) + [
                 f"schedule   {self.schedule}"]
        if self.split:
            lines.append(f"parts      {_parts(self.schedule)}")
        if not self.unfused:
            lines += [f"mapping    {self.mapping}", f"predicted  {_duration(self.predicted_s)}"]
        lines.append(f"measured   {_duration(self.best_s)}  (spread {self.spread * 100:.0f}%)")
        if self.unfused:
            if self.fused_s > 0:
                split = _is_split(self.fused_schedule)
                lines.append(f"fused      {_duration(self.fused_s)}  the best "
                             f"{'candidate, partly fused' if split else 'fused kernel'} ({self.fused_schedule})")
                lines.append(f"unfused wins: fusion does not pay here (the "
                             f"{'partly fused chain' if split else 'fused kernel'} runs at "
                             f"{self.best_s / self.fused_s:.2f}x the unfused chain's speed); the answer runs the "
                             "chain unfused")
        elif self.baseline_s > 0:
            lines.append(f"baseline   {_duration(self.baseline_s)}  (unfused: {self.baseline_kind})")
            lines.append(f"speedup    {self.speedup:.2f}x over the unfused baseline")
        return "\n".join(lines)


@dataclass
class Started:
    """A tuning task started (the first event of :meth:`Client.tune_events` on a cache miss)."""

    task_id: str
    workload_key: str
    target_fingerprint: str
    space_size: int
    space_after_pruning: int
    budget: int

    @classmethod
    def from_proto(cls, s: scheduler_pb2.TaskStarted) -> "Started":
        return cls(s.task_id, s.workload_key, s.target_fingerprint, s.space_size, s.space_after_pruning, s.budget)


@dataclass
class Progress:
    """Candidates measured so far, and the best one."""

    measured: int
    failed: int
    noisy: int
    budget: int
    best_s: float
    best_schedule: str

    @classmethod
    def from_proto(cls, p: scheduler_pb2.TuneProgress) -> "Progress":
        return cls(p.measured, p.failed, p.noisy, p.budget, p.best_s, p.best_schedule)


@dataclass
class Worker:
    """A worker the scheduler knows."""

    worker_id: str
    name: str
    state: str  # "alive" or "lost"
    target_fingerprint: str
    arch: str
    device_name: str
    jobs_done: int
    registered_unix_ms: int
    last_seen_unix_ms: int
    target: target_pb2.Target = field(repr=False)

    @classmethod
    def from_proto(cls, w: scheduler_pb2.WorkerInfo) -> "Worker":
        return cls(w.worker_id, w.name, w.state, w.target.fingerprint, w.target.arch, w.target.device_name,
                   w.jobs_done, w.registered_unix_ms, w.last_seen_unix_ms, w.target)


@dataclass
class Task:
    """A tuning task: its state, progress and, once done, its result."""

    task_id: str
    state: str  # "running", "done" or "failed"
    workload_key: str
    target_fingerprint: str
    progress: Progress
    error: str
    created_unix_ms: int
    finished_unix_ms: int
    result: Optional[Result]
    proto: Any = field(repr=False)

    @classmethod
    def from_proto(cls, t: scheduler_pb2.TaskInfo) -> "Task":
        return cls(t.task_id, t.state, t.workload_key, t.target_fingerprint, Progress.from_proto(t.progress), t.error,
                   t.created_unix_ms, t.finished_unix_ms, Result.from_proto(t.result) if t.HasField("result") else None,
                   t)


_SPLIT = "split after "


def _is_split(schedule: str) -> bool:
    """Whether a schedule text runs the chain in two parts ("split after T: HEAD | TAIL")."""
    return schedule.startswith(_SPLIT)


def _parts(schedule: str) -> str:
    """How a split schedule ("split after T: HEAD | TAIL") runs its parts, in words."""
    boundary, _, parts = schedule[len(_SPLIT):].partition(":")
    words = [f"the {name} {'unfused, through ' + text.strip()[len('unfused '):] if text.strip().startswith('unfused ') else 'fused'}"
             for name, text in zip(("head", "tail"), parts.split("|"))]
    return f"the chain in two kernels run in turn, split after {boundary}: " + ", ".join(words)


@dataclass
class Explanation:
    """Why a chain has no record of its own (:meth:`fusor.Client.explain`): the nearest record (of the same
    chain at other sizes, else of a chain of the same name, on any target) and each field of the key or of the
    target in which it differs, as (field, here, there); `result` is the answer the lookup gave, if any."""

    workload_key: str
    family_key: str
    nearest_key: str
    nearest_target: str
    differences: List[Tuple[str, str, str]]
    summary: str
    result: Optional[Result]

    @classmethod
    def from_proto(cls, why: scheduler_pb2.Explanation, result: Optional[Result]) -> "Explanation":
        return cls(workload_key=why.workload_key, family_key=why.family_key, nearest_key=why.nearest_key,
                   nearest_target=why.nearest_target,
                   differences=[(d.field, d.wanted, d.found) for d in why.differences], summary=why.summary,
                   result=result)

    def __str__(self) -> str:
        lines = [f"why        key {self.workload_key}, family {self.family_key}"]
        if not self.nearest_key:
            return "\n".join(lines + [f"nearest    none: {self.summary}"])
        lines.append(f"nearest    workload {self.nearest_key} on target {self.nearest_target}")
        lines += [f"{'differs   ' if i == 0 else '          '} {f}: {a or '(none)'} here, {b or '(none)'} there"
                  for i, (f, a, b) in enumerate(self.differences)]
        return "\n".join(lines)
