"""Regions of a model run by fusor kernels: tuned in the background, used only where they win.

A region is a chain found in a captured graph (an attention, a feed-forward
block, a convolution chain). The graph calls it through a custom operator
(``fusor::attention``, ``fusor::ffn``, ``fusor::conv``) with the tensors the
model already holds, views included. Each call:

1. writes the chain those tensors describe, where they lie (once per shapes
   and strides), or, where no chain can read them in place, runs the
   original ops;
2. asks for the chain's kernel: the first time, a background thread asks the
   scheduler (its cache first, tuning on a miss) while the original ops
   answer, so a forward pass never waits (unless tuning ahead was asked for);
3. when the kernel has arrived, compares it once with the original ops on
   the call's own tensors: outputs checked, both timed in alternating rounds.
   The kernel is kept only when it is correct and faster; otherwise the chain
   stays with the original ops for the rest of the process.

Verdicts are kept per chain (identical layers share one) and listed by
:func:`report`. The original ops are those of the captured graph (SDPA stays
SDPA, an ``nn.Linear`` stays ``linear``), run eagerly; whether the graph as a
whole gains over the graph as captured (compiled by inductor, say) is checked
after (see _dispatch).
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .._chain import Chain
from .._kernel import Kernel
from .. import _strided
from .._strided import Unsupported, View
from ._helpers import _DTYPES, _MASKED, explain, refine, requests
from ._helpers import kernel as compiled_kernel

log = logging.getLogger("fusor.torch")

# How far a kernel's output may be from the original ops' (relative to the largest magnitude) and still be used.
_TOLERANCE = {"f32": 2e-3, "f16": 2e-2, "bf16": 6e-2}
# How much faster than the original ops a kernel must be to replace them (a tie keeps the original ops).
_MARGIN = 1.03
# The largest extent a chain may have (the scheduler's limit): a larger tensor runs the original ops.
_MAX_EXTENT = 1 << 24
# A chain whose tune failed is tuned again at a call this many seconds later, up to _ATTEMPTS tunes in all.
_RETRY_SECONDS = 60.0
_ATTEMPTS = 3


@dataclass
class Settings:
    """How regions get their kernels. tune: "background" (the original ops answer until the kernel has
    arrived and won) or "ahead" (a call waits for its chain's kernel). budget: candidates measured per chain
    (0: the scheduler's default). rounds: alternating timing rounds of the comparison. tune_seconds: the
    wall time the background tunes of this process may take in all (None: no cap); once spent, chains not
    tuned yet keep the original ops."""

    tune: str = "background"
    budget: int = 0
    rounds: int = 7
    tune_seconds: Optional[float] = None


# The dims a request changes, per kind of region: its batch, query and key lengths, rows. A region asks for
# the kernel of the range of sizes around each (the scheduler's ranges), served to every size in it.
_VARY = {"attention": ("z0", "m", "n"), "ffn": ("m",), "conv": ("n",)}


def range_for(size: int) -> Tuple[int, int]:
    """The range of sizes the scheduler serves with `size` (ir::RangeFor): 1; 2..16; then ranges four times as
    long as the last (17..64, 65..256, ...). Only groups the calls that wait for one kernel; the kernel's own
    ranges say what it serves."""
    if size <= 1:
        return 1, 1
    if size <= 16:
        return 2, 16
    hi = 64
    while hi < size and hi < _MAX_EXTENT:
        hi *= 4
    hi = min(hi, _MAX_EXTENT)
    return hi // 4 + 1, hi


def chain_sizes(text: str) -> Dict[str, int]:
    """The sizes of a chain text's dims ("dim m=128 n=64 ..."), by name."""
    for line in text.splitlines():
        if line.startswith("dim "):
            return {name: int(size) for name, _, size in (part.partition("=") for part in line.split()[1:])}
    return {}


def _template(text: str, varying: Sequence[str]) -> str:
    """The chain text with the sizes of `varying` left out: chains that differ only there share it."""
    return "\n".join(" ".join(part if part.partition("=")[0] not in varying else part.partition("=")[0] + "=?"
                               for part in line.split()) if line.startswith("dim ") else line
                     for line in text.splitlines())


@dataclass
class Verdict:
    """What became of one chain, at one range of sizes, on one backend."""

    chain: str  # the text of the first call that asked (its exact sizes)
    backend: str
    vary: Tuple[str, ...] = ()  # the dims served over a range
    state: str = "tuning"  # tuning, ready (kernel here, not yet compared), fused, unfused, failed
    reason: str = ""
    kernel: Optional[Kernel] = None
    kernel_us: float = 0.0
    original_us: float = 0.0
    error: float = 0.0
    regions: List[str] = field(default_factory=list)
    attempts: int = 0
    retry_at: float = 0.0
    answer: str = ""  # tuned, covered, transferred
    why: str = ""  # why the scheduler had no record of its own
    seen_us: float = 0.0  # the original ops' time in the calls made while it waited: its expected gain
    budget: int = 0  # candidates its tune measures (0: the scheduler's default)
    refined: bool = False  # carried over from other sizes, then tuned again (Verdicts._refined)

    @property
    def name(self) -> str:
        return self.chain.split("\n", 1)[0].replace("chain ", "")

    @property
    def served(self) -> str:
        """The ranges its kernel serves, "m=65..256 n=65..256" ("" for exact sizes or no kernel)."""
        return " ".join(f"{n}={lo}..{hi}" for n, lo, hi in self.kernel.ranges) if self.kernel else ""


class Verdicts:
    """The chains regions have met, at each range of sizes, their kernels and verdicts. Kernels are asked for
    on one background thread, the chain whose calls have spent the most time in the original ops first, within
    the tuning budget's wall time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._by_key: Dict[Tuple[Any, ...], Verdict] = {}
        self._queue: List[Verdict] = []
        self._refine: List[Verdict] = []  # ranges whose kernel was carried over: tuned when nothing else waits
        self._running = 0
        self._settings = Settings()  # the background thread's (the first background ask's)
        self._thread: Optional[threading.Thread] = None
        self._spent_s = 0.0

    def get(self, text: str, backend: str, region: str, settings: Settings, vary: Sequence[str] = ()) -> Verdict:
        """The verdict of `text` on `backend` (of its range of sizes of `vary`, where the backend serves ranges);
        the first ask queues its kernel's compile (or compiles now when tuning ahead)."""
        sizes = chain_sizes(text)
        varying = tuple(d for d in vary if d in sizes)
        key = (_template(text, varying), backend, tuple(range_for(sizes[d]) for d in varying))
        with self._lock:
            verdict = self._by_key.get(key)
            if verdict is not None:
                if region not in verdict.regions:
                    verdict.regions.append(region)
                if not (verdict.state == "failed" and verdict.attempts < _ATTEMPTS
                        and time.monotonic() >= verdict.retry_at):
                    return verdict
                verdict.state = "tuning"  # a failed tune (a busy machine's noisy measurements) is tried again
            else:
                verdict = self._by_key[key] = Verdict(text, backend, varying, regions=[region])
            verdict.attempts += 1
            verdict.budget = settings.budget
            if settings.tune != "ahead":
                self._queue.append(verdict)
                if self._thread is None:
                    self._settings = settings
                    self._thread = threading.Thread(target=self._serve, args=(settings,), name="fusor-tune",
                                                    daemon=True)
                    self._thread.start()
                self._changed.notify_all()
                return verdict
        # Tuned ahead, within the request that asked: the worker must not hold its jobs for that request.
        counters = requests()
        with counters.aside() if counters is not None else contextlib.nullcontext():
            self._compile(verdict, settings.budget)
        return verdict

    def _serve(self, settings: Settings) -> None:
        """The background thread: the queued chains, the greatest expected gain first, while the budget lasts;
        when none waits, a tune of a range whose kernel was carried over from other sizes (refined)."""
        while True:
            with self._lock:
                while not self._queue and not (self._refine and not self._spent(settings)):
                    self._changed.wait()
                refining = not self._queue
                pool = self._refine if refining else self._queue
                verdict = max(pool, key=lambda v: v.seen_us)
                pool.remove(verdict)
                spent = self._spent(settings)
                self._running += 1
            try:
                start = time.monotonic()
                if refining:
                    self._refined(verdict)
                elif spent:
                    verdict.state = "failed"
                    verdict.attempts = _ATTEMPTS
                    verdict.reason = (f"the tuning budget ({settings.tune_seconds:g} s of background tuning) is "
                                      "spent: the original ops run")
                else:
                    self._compile(verdict, verdict.budget)
                    if verdict.answer == "transferred":
                        with self._lock:
                            self._refine.append(verdict)
                with self._lock:
                    self._spent_s += time.monotonic() - start
            finally:
                with self._lock:
                    self._running -= 1
                    self._changed.notify_all()

    def _spent(self, settings: Settings) -> bool:
        return settings.tune_seconds is not None and self._spent_s >= settings.tune_seconds

    def _refined(self, verdict: Verdict) -> None:
        """Tunes the range of a kernel carried over from other sizes; a kernel of another schedule is compared
        with the original ops again at its next call."""
        log.info("fusor: refining %s on %s (its kernel was carried over from other sizes)", verdict.name,
                 verdict.backend)
        try:
            found = refine(Chain.parse(verdict.chain), verdict.backend, verdict.budget, verdict.vary)
        except Exception as e:  # noqa: BLE001 (the carried-over kernel stays)
            log.warning("fusor: refining %s failed (its kernel stays): %s: %s", verdict.name, type(e).__name__, e)
            return
        with self._lock:
            verdict.refined = True
            if verdict.kernel is not None and found.schedule != verdict.kernel.schedule:
                verdict.kernel, verdict.answer, verdict.state = found, found.result.answer, "ready"

    @staticmethod
    def _compile(verdict: Verdict, budget: int) -> None:
        log.info("fusor: tuning %s on %s", verdict.name, verdict.backend)
        chain = Chain.parse(verdict.chain)
        try:
            if verdict.vary:
                explained = explain(chain, verdict.backend, verdict.vary)
                verdict.why = explained.summary if explained.result is None else ""
            found = compiled_kernel(chain, verdict.backend, budget, verdict.vary)
        except Exception as e:  # noqa: BLE001 (any failure leaves the original ops in place, said once)
            verdict.state, verdict.reason = "failed", f"{type(e).__name__}: {e}"
            verdict.retry_at = time.monotonic() + _RETRY_SECONDS
            log.warning("fusor: %s keeps the original ops for now (tune %d of %d): %s", verdict.name,
                        verdict.attempts, _ATTEMPTS, verdict.reason)
            return
        verdict.kernel = found
        verdict.answer = found.result.answer
        verdict.state = "ready"

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits for the kernels asked for so far (refinements within the budget included); False when `timeout`
        seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._queue or self._running or (self._refine and self._thread is not None and
                                                   not self._spent(self._settings)):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def all(self) -> List[Verdict]:
        with self._lock:
            return list(self._by_key.values())

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()


VERDICTS = Verdicts()
_regions: Dict[str, "Region"] = {}
_regions_lock = threading.Lock()
# The regions that may run their kernels on this thread (None: every one); see only().
_allowed = threading.local()


def only(allowed: frozenset, graph: Callable[..., Any], *args: Any) -> Any:
    """Runs `graph` with only the regions in `allowed` (ids) running their kernels; the others run their
    original ops."""
    previous = getattr(_allowed, "regions", None)
    _allowed.regions = allowed
    try:
        return graph(*args)
    finally:
        _allowed.regions = previous


def _refused(tensors: Sequence[torch.Tensor]) -> Optional[str]:
    """Why the region's original ops answer for these tensors whatever the verdicts (None: they need not)."""
    first = tensors[0]
    if first.dtype not in _DTYPES:
        return f"the dtype {first.dtype} is not one fusor computes"
    if any(t.device != first.device for t in tensors):
        return "the tensors are on different devices"
    if any(t.numel() == 0 for t in tensors):
        return "a tensor has no elements"
    if any(size > _MAX_EXTENT for t in tensors for size in t.shape):
        return f"a dim is longer than {_MAX_EXTENT}"
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Region:
    """One chain found in a graph. Subclasses say how the chain is written from the call's tensors, how the
    kernel is called, how the original ops run, and the output's shape."""

    kind = ""

    def __init__(self, source: str, settings: Settings):
        self.source = source  # the graph nodes it replaces, for messages
        self.settings = settings
        self._plans: Dict[Any, Optional[str]] = {}
        self._original: set = set()  # signatures of calls the original ops answer for good
        self.id = ""  # given by register()
        self.chain = ""  # the text of the chain its last call ran or compared
        self.last = "pending"  # what answered the last call: "pending" (no verdict yet), "fused" or "original"
        self.last_key: Any = None  # the verdict its last call used (None: the original ops answered regardless)
        # Kernels with their constant inputs (the parameters) packed once: by kernel and by the parameters'
        # storage and version, so that weights changed in place are packed again.
        self._packed: Dict[Any, Any] = {}

    def register(self) -> str:
        """Gives the region its id, by which the graph's operator call finds it."""
        with _regions_lock:
            self.id = f"{self.kind}{len(_regions)}"
            _regions[self.id] = self
        return self.id

    # What subclasses provide.
    def original(self, *args: Any) -> torch.Tensor:
        """The ops the region replaces, as the graph ran them (eagerly: what inductor makes of them is
        compared at the graph's level, see _dispatch)."""
        raise NotImplementedError

    def output_shape(self, *args: Any) -> List[Any]:
        raise NotImplementedError

    def write(self, *args: Any) -> str:
        raise NotImplementedError

    def operands(self, *args: Any) -> List[torch.Tensor]:
        """The kernel's inputs in declaration order, as views of the call's tensors (same first element)."""
        raise NotImplementedError

    def key(self, *prepared: Any) -> Any:
        """What the written chain depends on: the prepared tensors' shapes, strides, dtypes and devices."""
        return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                     for a in prepared)

    def prepare(self, *args: Any) -> Tuple[Any, ...]:
        """The call's arguments as the kernel reads them (a mask made additive, say); Unsupported where it
        cannot."""
        return args

    # The call.
    def __call__(self, *args: Any) -> torch.Tensor:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        self.last, self.last_key = "original", None
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.original(*args).contiguous()
        allowed = getattr(_allowed, "regions", None)
        if allowed is not None and self.id not in allowed:
            return self.original(*args).contiguous()
        signature = self.key(*args)
        if signature in self._original:
            return self.original(*args).contiguous()
        refused = _refused(tensors)
        if refused is not None:  # said once per shapes; nothing is asked of the scheduler
            self._say(args, refused)
            self._original.add(signature)
            return self.original(*args).contiguous()
        try:
            prepared = self.prepare(*args)
        except Unsupported as e:
            self._say(args, e)
            self._original.add(signature)
            return self.original(*args).contiguous()
        key = self.key(*prepared)
        if key not in self._plans:
            self._plans[key] = self._plan(args, prepared)
        text = self._plans[key]
        if text is None:
            self._original.add(signature)
            return self.original(*args).contiguous()
        backend = tensors[0].device.type
        # A CPU kernel serves a range of the sizes a request changes; a GPU's takes exact sizes.
        verdict = VERDICTS.get(text, backend, self.id, self.settings, _VARY.get(self.kind, ()) if backend == "cpu" else ())
        self.chain, self.last_key = text, id(verdict)
        if verdict.kernel is not None and not verdict.kernel.covers(chain_sizes(text)):
            self._say(args, f"the kernel serves {verdict.served}, not these sizes")
            self._original.add(signature)
            return self.original(*args).contiguous()
        if verdict.state == "fused":
            self.last = "fused"
            try:
                return self._run(verdict.kernel, args, prepared)
            except Exception as e:  # noqa: BLE001 (a kernel that fails never fails the forward pass)
                self._give_up(verdict, e)
                self.last = "original"
                return self.original(*args).contiguous()
        if verdict.state == "ready":
            out = self._decide(verdict, *args)
            self.last = "fused" if verdict.state == "fused" else "original"
            return out
        if verdict.state == "unfused" or (verdict.state == "failed" and verdict.attempts >= _ATTEMPTS):
            self._original.add(signature)  # (a mask that reads differently would keep the original ops too)
            return self.original(*args).contiguous()
        if verdict.state != "failed":  # a failed tune tried again later leaves the graph settled as it is
            self.last = "pending"
        # While it waits, what its calls cost in the original ops is its expected gain: the tunes queued go
        # in that order.
        start = time.perf_counter()
        out = self.original(*args).contiguous()
        verdict.seen_us += (time.perf_counter() - start) * 1e6
        return out

    def _say(self, args: Sequence[Any], why: Any) -> None:
        log.info("fusor: %s (%s) keeps the original ops for %s: %s", self.id, self.source,
                 [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)], why)

    def _plan(self, args: Sequence[Any], prepared: Sequence[Any]) -> Optional[str]:
        try:
            return self.write(*prepared)
        except Unsupported as e:
            self._say(args, e)
            return None

    def _run(self, kernel: Optional[Kernel], args: Sequence[Any], prepared: Sequence[Any]) -> torch.Tensor:
        assert kernel is not None
        first = args[0]
        out = torch.empty(self.output_shape(*args), dtype=first.dtype, device=first.device)
        operands = self.operands(*prepared)
        pointers = [t.data_ptr() for t in operands]
        # A kernel of a range of sizes runs at the sizes of the chain these tensors make.
        text = self._plans.get(self.key(*prepared)) or ""
        sizes = chain_sizes(text)
        dims = [sizes[name] for name, _, _ in kernel.ranges]
        packed = self._packed_kernel(kernel, operands, pointers)
        if packed is not None:
            packed.run_pointers([p for p, s in zip(pointers, kernel.inputs) if not s.constant], [out.data_ptr()],
                                dims)
        else:
            kernel.run_pointers(pointers, [out.data_ptr()], device=first.device.index or 0, dims=dims)
        return out

    def _packed_kernel(self, kernel: Kernel, operands: Sequence[torch.Tensor], pointers: Sequence[int]) -> Any:
        """The kernel with the call's constant operands packed (once per kernel and parameter version), or None
        where it packs nothing."""
        if kernel.language != "c++" or not kernel.metadata.get("prepare"):
            return None
        constants = [t for t, s in zip(operands, kernel.inputs) if s.constant]
        if any(t.is_inference() for t in constants):
            return None  # an inference tensor has no version counter: a change in place would go unseen
        key = (id(kernel), tuple((t.data_ptr(), t._version) for t in constants))
        found = self._packed.get(key)
        if found is None:
            if len(self._packed) >= 4:  # other shapes or weights since: the oldest goes
                self._packed.pop(next(iter(self._packed)))
            packed = kernel.prepare_pointers([p if s.constant else 0 for p, s in zip(pointers, kernel.inputs)])
            # The tensors are held with their packs, so that their storage is not reused by others.
            self._packed[key] = found = (packed, constants)
        return found[0]

    def _fused(self, kernel: Optional[Kernel], *args: Any) -> torch.Tensor:
        return self._run(kernel, args, self.prepare(*args))

    def _decide(self, verdict: Verdict, *args: Any) -> torch.Tensor:
        """Compares the kernel with the original ops on this call's tensors, once per chain (the kernel's time
        includes preparing its arguments); returns the original ops' answer."""
        reference = self.original(*args).contiguous()
        kernel = verdict.kernel  # (a refinement may replace it meanwhile: the next call compares that one)
        try:
            got = self._fused(kernel, *args)
        except Exception as e:  # noqa: BLE001
            self._give_up(verdict, e)
            return reference
        scale = max(1.0, float(reference.abs().max()))
        error = float((got.float() - reference.float()).abs().max()) / scale
        if verdict.kernel is not kernel:
            return reference
        verdict.error = error
        if not math.isfinite(error) or error > _TOLERANCE[_DTYPES[reference.dtype]]:
            verdict.state = "unfused"
            verdict.reason = f"its output differs from the original ops' by {error:.2g} (relative)"
            log.warning("fusor: %s keeps the original ops: %s", verdict.name, verdict.reason)
            return reference
        try:
            self._time(verdict, kernel, args, reference.device)
        except Exception as e:  # noqa: BLE001
            self._give_up(verdict, e)
        return reference

    @staticmethod
    def _give_up(verdict: Verdict, error: Exception) -> None:
        verdict.state, verdict.reason = "failed", f"the kernel failed: {type(error).__name__}: {error}"
        verdict.attempts = _ATTEMPTS  # the same kernel would fail again
        log.warning("fusor: %s keeps the original ops: %s", verdict.name, verdict.reason)

    def _time(self, verdict: Verdict, kernel: Optional[Kernel], args: Sequence[Any], device: torch.device) -> None:
        """Times the original ops against `kernel` in alternating rounds and records the verdict (unless a
        refinement replaced the verdict's kernel meanwhile)."""
        runs: List[Tuple[Callable[..., Any], List[float]]] = [
            (self.original, []), (lambda *a: self._fused(kernel, *a), [])]
        for attempt in range(2):
            for i in range(self.settings.rounds):
                for run, times in (runs if i % 2 == 0 else runs[::-1]):
                    _sync(device)
                    start = time.perf_counter()
                    run(*args)
                    _sync(device)
                    times.append(time.perf_counter() - start)
            original_s, kernel_s = (statistics.median(times) for _, times in runs)
            if abs(original_s / kernel_s - 1.0) > 0.05:  # clear either way; a near tie gets a second set of rounds
                break
        if verdict.kernel is not kernel:
            return
        verdict.kernel_us, verdict.original_us = kernel_s * 1e6, original_s * 1e6
        if original_s >= kernel_s * _MARGIN:
            verdict.state = "fused"
            verdict.reason = f"{original_s / kernel_s:.2f}x the original ops"
        else:
            verdict.state = "unfused"
            verdict.reason = (f"the original ops are as fast or faster ({verdict.original_us:.0f} us against the "
                              f"kernel's {verdict.kernel_us:.0f} us): fusion does not pay here")
        log.info("fusor: %s: %s", verdict.name, verdict.reason)


def region(region_id: str) -> Region:
    with _regions_lock:
        return _regions[region_id]


class AttentionRegion(Region):
    """softmax(q kᵀ · scale + mask) v, as SDPA or as matmul, scale, mask, softmax and matmul; the output
    optionally permuted and reshaped as the graph did after it (`out_order`, `out_groups`: the output's dims
    in storage order, and how many of them in a row each dim of the region's output merges). The mask is
    added (`mask_mode` "add"; SDPA's boolean masks keep where True), or a boolean one that masks the scores
    out where True ("fill": masked_fill) or keeps them where True ("keep": where) with `fill`."""

    kind = "attention"

    def __init__(self, source: str, settings: Settings, *, form: str, scale: Optional[float], causal: bool,
                 gqa: bool, k_transposed: bool, out_order: Sequence[int], out_groups: Sequence[int],
                 mask_mode: str = "add", fill: float = 0.0):
        super().__init__(source, settings)
        self.mask_mode, self.fill = mask_mode, fill
        self.form, self.scale, self.causal, self.gqa = form, scale, causal, gqa
        self.k_transposed = k_transposed
        self.out_order, self.out_groups = tuple(out_order), tuple(out_groups)

    def _k(self, k: torch.Tensor) -> torch.Tensor:
        return k.transpose(-1, -2) if self.k_transposed else k

    def _scale(self, q: torch.Tensor) -> float:
        if self.scale is not None:
            return self.scale
        return 1.0 / math.sqrt(q.shape[-1]) if self.form == "sdpa" else 1.0  # only SDPA's None means 1/sqrt(D)

    def logical_shape(self, q: torch.Tensor, v: torch.Tensor) -> List[Any]:
        return list(q.shape[:-1]) + [v.shape[-1]]

    def output_shape(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                     form: Optional[torch.Tensor] = None) -> List[Any]:
        dims = self.logical_shape(q, v)
        ordered = [dims[i] for i in self.out_order]
        shape, at = [], 0
        for count in self.out_groups:
            size: Any = 1
            for d in ordered[at:at + count]:
                size = size * d
            shape.append(size)
            at += count
        return shape

    def original(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                 form: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.form == "sdpa":
            kwargs: Dict[str, Any] = {"attn_mask": mask, "is_causal": self.causal, "scale": self.scale}
            if self.gqa:
                kwargs["enable_gqa"] = True
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            scores = torch.matmul(q, k if self.k_transposed else k.transpose(-1, -2))
            if self.scale is not None:
                scores = scores * self.scale
            if mask is not None and self.mask_mode == "fill":
                scores = scores.masked_fill(mask, self.fill)
            elif mask is not None and self.mask_mode == "keep":
                scores = torch.where(mask, scores, self.fill)
            elif mask is not None:
                scores = scores + mask
            out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return out.permute(*self.out_order).reshape(self.output_shape(q, k, v, mask))

    def mask_form(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """What the kernel needs to know of the mask's values, as int64 [M, N, rows_same, offset, whole]: whether
        every query's row is the same (a padding mask built per row), the causal offset c (-1: not causal)
        when every key past the query's m + c is masked, and whether the mask is that and nothing else. A
        mask shared by many regions (every layer's) is read once per forward pass: the graph computes it
        once (the ``fusor::mask_form`` operator) and hands it to each region."""
        m, n = q.shape[-2], self._k(k).shape[-2]
        rows_same, offset, whole = False, None, False
        if m > 1 and mask.dim() >= 2 and mask.shape[-2] == m and mask.stride(-2) != 0:
            first = mask[..., :1, :]
            # The last row first: a causal mask's differs from the first's, so its rows are not compared.
            rows_same = (bool((mask[..., -1:, :] == first).all()) and bool((mask == first).all()))
        kept = self._kept(mask, q.dtype)
        if kept is not None and not rows_same:
            scores = list(q.shape[:-1]) + [n]
            values = None if mask.dtype == torch.bool else mask.expand(scores)
            offset, whole = _causal_offset(kept.expand(scores), values)
        return torch.tensor([m, n, rows_same, -1 if offset is None else offset, whole], dtype=torch.int64)

    def _kept(self, mask: torch.Tensor, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Where the mask keeps the scores (None where the kernel cannot read it: see _additive)."""
        if mask.dtype == torch.bool:
            if self.form == "matmul" and self.mask_mode == "add":
                return None
            return ~mask if self.mask_mode == "fill" else mask
        if self.mask_mode != "add" or mask.dtype != dtype:
            return None
        return mask > -1e4

    def _mask(self, q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor],
              form: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], Optional[int]]:
        """The additive mask of the chain dtype, expanded to the scores' shape (broadcast dims stride 0, and
        the query dim too when every row is the same, as a padding mask's rows are), and the causal offset
        (None: not causal): SDPA's is_causal, or a mask that masks every key past the query's m + offset
        (transformers' causal mask, built as a tensor), which then goes when it masks nothing else. `form`:
        the mask's mask_form, when the graph computed it for this forward pass."""
        if self.causal:
            return None, 0
        if mask is None:
            return None, None
        m, n = q.shape[-2], self._k(k).shape[-2]
        values = form.tolist() if form is not None else []
        if values[:2] != [m, n]:
            values = self.mask_form(q, k, mask).tolist()
        _, _, rows_same, offset, whole = values
        if whole:
            return None, offset
        return self._additive(q, k, mask[..., :1, :] if rows_same else mask), (None if offset < 0 else offset)

    def _additive(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = list(q.shape[:-1]) + [self._k(k).shape[-2]]
        mask = mask.expand(scores)
        if mask.dtype == torch.bool and self.form == "matmul" and self.mask_mode == "add":
            raise Unsupported("a boolean mask added to the scores")
        if mask.dtype == torch.bool:
            compact = mask[tuple(slice(0, 1) if st == 0 else slice(None) for st in mask.stride())]
            masked = compact if self.mask_mode == "fill" else ~compact
            additive = torch.zeros(compact.shape, dtype=q.dtype, device=q.device).masked_fill(
                masked, _MASKED[_DTYPES[q.dtype]])
            return additive.expand(scores)
        if self.mask_mode != "add":
            raise Unsupported(f"a {mask.dtype} mask for masked_fill or where")
        if mask.dtype != q.dtype:
            raise Unsupported(f"the mask is {mask.dtype}, the scores {q.dtype}")
        return mask

    def prepare(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                form: Optional[torch.Tensor] = None) -> Tuple[Any, ...]:
        return (q, self._k(k), v) + self._mask(q, k, mask, form)

    def write(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
              causal: Optional[int]) -> str:
        return _strided.attention(View.of(q), View.of(k), View.of(v), None if mask is None else View.of(mask),
                                 self._scale(q), _DTYPES[q.dtype], self.out_order, self.gqa, causal)

    def operands(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                 causal: Optional[int]) -> List[torch.Tensor]:
        return [q, k, v] + ([] if mask is None else [mask])


def _causal_offset(kept: torch.Tensor, values: Optional[torch.Tensor] = None) -> Tuple[Optional[int], bool]:
    """For a mask [..., M, N] that keeps the scores where `kept` is true: the least offset c >= 0 such that
    every key n > m + c is masked in every row, when there is one below N - 1 (else None); and whether the
    mask is that and nothing else (every other key kept and, for an additive mask, its `values` 0 there).
    A row that keeps no key at all (a padded query) makes it None: the softmax over every key and over the
    causal ones would differ there."""
    m, n = kept.shape[-2:]
    if m < 2 or kept.stride(-2) == 0 or kept.stride(-1) == 0:
        return None, False
    lead = tuple(slice(0, 1) if st == 0 else slice(None) for st in kept.stride()[:-2])
    kept_each = kept[lead].reshape(-1, m, n)
    if not bool(kept_each.any(-1).all()):
        return None, False
    last = torch.where(kept_each.any(0), torch.arange(n, device=kept.device), -1).amax(-1)  # per query: its last key
    offset = max(0, int((last - torch.arange(m, device=kept.device)).amax()))
    if offset >= n - 1:
        return None, False
    past = torch.ones(m, n, dtype=torch.bool, device=kept.device).triu(offset + 1)
    if values is not None:
        return offset, bool((values[lead].masked_fill(past, 0) == 0).all())
    return offset, bool(kept_each.masked_fill(past, True).all())


_ACTIVATIONS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu}


class FfnRegion(Region):
    """act(x w1 + b1) [* (x wu + bu)] w2 + b2. Weights as the graph holds them: `transposed` when they are
    ``nn.Linear``'s ``[out, in]`` (else ``[in, out]``, as GPT-2's Conv1D and a plain matmul hold them)."""

    kind = "ffn"

    def __init__(self, source: str, settings: Settings, *, activation: Optional[str], transposed: bool):
        super().__init__(source, settings)
        self.activation, self.transposed = activation, transposed
        self.activation_fn: Callable[[torch.Tensor], torch.Tensor] = (
            _ACTIVATIONS[activation] if activation else (lambda x: x))

    def _w(self, w: torch.Tensor) -> torch.Tensor:
        return w.t() if self.transposed else w

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
        if self.transposed:
            return F.linear(x, w, b)
        if b is not None and x.dim() == 2:
            return torch.addmm(b, x, w)
        return torch.matmul(x, w) if b is None else torch.matmul(x, w) + b

    def original(self, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                 b2: Optional[torch.Tensor], wu: Optional[torch.Tensor], bu: Optional[torch.Tensor]) -> torch.Tensor:
        hidden = self.activation_fn(self._linear(x, w1, b1))
        if wu is not None:
            hidden = hidden * self._linear(x, wu, bu)
        return self._linear(hidden, w2, b2)

    def output_shape(self, x: torch.Tensor, w1: torch.Tensor, b1: Any, w2: torch.Tensor, *rest: Any) -> List[Any]:
        return list(x.shape[:-1]) + [self._w(w2).shape[-1]]

    def write(self, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
              b2: Optional[torch.Tensor], wu: Optional[torch.Tensor], bu: Optional[torch.Tensor]) -> str:
        for name, t in (("b1", b1), ("b2", b2), ("bu", bu)):
            if t is not None and (t.dim() != 1 or t.stride(0) != 1):
                raise Unsupported(f"the bias {name} {tuple(t.shape)} is not a dense vector")
        return _strided.ffn(View.of(x), View.of(self._w(w1)), View.of(self._w(w2)), _DTYPES[x.dtype],
                           self.activation, b1 is not None, b2 is not None,
                           None if wu is None else View.of(self._w(wu)), bu is not None)

    def operands(self, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                 b2: Optional[torch.Tensor], wu: Optional[torch.Tensor], bu: Optional[torch.Tensor]) -> List[torch.Tensor]:
        # Declaration order: X W1 [B1] [WU [BU]] W2 [B2].
        return [t for t in (x, w1, b1, wu, bu, w2, b2) if t is not None]


def _pair(value: Any) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class ConvRegion(Region):
    """conv1x1(act(conv(x, w1) + b1), w2) + b2: a convolution (one group; stride, padding, dilation), an
    optional elementwise activation, and an unpadded 1x1 convolution. A padded first convolution reads its
    input zero-padded ahead of the kernel (a copy: the chain's indices cannot express the border)."""

    kind = "conv"

    def __init__(self, source: str, settings: Settings, *, activation: Optional[str], stride: Any, padding: Any,
                 dilation: Any):
        super().__init__(source, settings)
        self.activation = activation
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.activation_fn: Callable[[torch.Tensor], torch.Tensor] = (
            _ACTIVATIONS[activation] if activation else (lambda x: x))

    def original(self, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                b2: Optional[torch.Tensor]) -> torch.Tensor:
        hidden = F.conv2d(x, w1, b1, self.stride, self.padding, self.dilation)
        return F.conv2d(self.activation_fn(hidden), w2, b2)

    def output_shape(self, x: torch.Tensor, w1: torch.Tensor, b1: Any, w2: torch.Tensor, b2: Any) -> List[Any]:
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        r, s = w1.shape[2], w1.shape[3]
        return [x.shape[0], w2.shape[0], (x.shape[2] + 2 * ph - dh * (r - 1) - 1) // sh + 1,
                (x.shape[3] + 2 * pw - dw * (s - 1) - 1) // sw + 1]

    def prepare(self, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                b2: Optional[torch.Tensor]) -> Tuple[Any, ...]:
        ph, pw = self.padding
        return (F.pad(x, (pw, pw, ph, ph)) if ph or pw else x), w1, b1, w2, b2

    def write(self, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
              b2: Optional[torch.Tensor]) -> str:
        for name, t in (("b1", b1), ("b2", b2)):
            if t is not None and t.stride(0) != 1:
                raise Unsupported(f"the bias {name} is not a dense vector")
        return _strided.conv_chain(View.of(x), View.of(w1), View.of(w2), _DTYPES[x.dtype], self.stride,
                                   self.dilation, self.activation, b1 is not None, b2 is not None)

    def operands(self, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                 b2: Optional[torch.Tensor]) -> List[torch.Tensor]:
        return [t for t in (x, w1, b1, w2, b2) if t is not None]  # declaration order: I W1 [B1] W2 [B2]


# The custom operators the rewritten graphs call. Their fake implementations give the output's shape
# (contiguous, as the real ones return), so graphs stay traceable by inductor and by export.
@torch.library.custom_op("fusor::attention", mutates_args=())
def attention_op(region_id: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: Optional[torch.Tensor], form: Optional[torch.Tensor] = None) -> torch.Tensor:
    return region(region_id)(q, k, v, mask, form)


@attention_op.register_fake
def _attention_fake(region_id: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: Optional[torch.Tensor], form: Optional[torch.Tensor] = None) -> torch.Tensor:
    return q.new_empty(region(region_id).output_shape(q, k, v, mask))


@torch.library.custom_op("fusor::mask_form", mutates_args=())
def mask_form_op(region_id: str, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    attention = region(region_id)
    assert isinstance(attention, AttentionRegion)
    return attention.mask_form(q, k, mask)


@mask_form_op.register_fake
def _mask_form_fake(region_id: str, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return q.new_empty((5,), dtype=torch.int64, device="cpu")


@torch.library.custom_op("fusor::ffn", mutates_args=())
def ffn_op(region_id: str, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
           b2: Optional[torch.Tensor], wu: Optional[torch.Tensor], bu: Optional[torch.Tensor]) -> torch.Tensor:
    return region(region_id)(x, w1, b1, w2, b2, wu, bu)


@torch.library.custom_op("fusor::conv", mutates_args=())
def conv_op(region_id: str, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
            b2: Optional[torch.Tensor]) -> torch.Tensor:
    return region(region_id)(x, w1, b1, w2, b2)


@conv_op.register_fake
def _conv_fake(region_id: str, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
               b2: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty(region(region_id).output_shape(x, w1, b1, w2, b2))


@ffn_op.register_fake
def _ffn_fake(region_id: str, x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
              b2: Optional[torch.Tensor], wu: Optional[torch.Tensor], bu: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty(region(region_id).output_shape(x, w1, b1, w2, b2, wu, bu))
