"""What the backend hands back for one captured graph: never slower than the graph as captured.

A region's own comparison (see _runtime) says whether its kernel beats the ops it replaces, run eagerly,
but a region also costs at its edges: the rest of the graph cannot fuse into it (a bias and a residual
add before a layer norm, say), and each call passes through Python; and inductor may run the replaced
ops faster than eager does. So once every region of the graph has settled for the inputs' shapes, the
graph with only the winning regions replaced is built, and it is timed against the graph as captured,
in turn, on that call's inputs, each compiled as the rest of the graph is and, when that is inductor,
also run as is. The fastest answers for those shapes from then on; on a tie the graph as captured does.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import OrderedDict
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.fx as fx

from ._graph import Found, rewrite
from ._helpers import requests
from ._runtime import Settings, only

log = logging.getLogger("fusor.torch")

# How much faster the graph with fusor's regions must be than the graph as captured to be kept.
_MARGIN = 1.02
# What each graph settled on, for fusor.torch.graphs().
DECISIONS: List[Dict[str, Any]] = []
# Samples of one variant further apart than this (relative to their median) are measured again, once.
_SPREAD = 0.5
# About how long the comparison of the two graphs may take (at least 2 rounds, at most 5).
_SECONDS = 2.0
# Decisions kept per graph (by input shapes, and by the verdicts the regions used): the oldest go first.
_KEPT = 256


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in t.shape)


def parameters(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Set[fx.Node]:
    """The nodes of `gm` that hold parameters (constants): placeholders given a Parameter, and attributes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {n for n, value in zip(placeholders, example_inputs) if isinstance(value, torch.nn.Parameter)}
    return params | {n for n in gm.graph.nodes if n.op == "get_attr"}


class GraphRunner:
    """Runs a captured graph: with every region found replaced until they settle, then, per input shapes,
    the fastest of the graph as captured and the graph with winning regions (see _settle).

    Every graph that runs was compiled for the sizes dynamo captured (symbolic ones included): the graph with
    regions is compiled here, inside dynamo's compile; the graph as captured, when the rest is compiled, by a
    torch.compile of its own, whose guards recompile it for sizes it was not built for. So no graph built for
    one shape is ever called with another."""

    def __init__(self, captured: fx.GraphModule, example_inputs: Sequence[Any], settings: Settings,
                 compile_rest: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
                 rest_compiled: bool = True):
        self.captured = copy.deepcopy(captured)
        self.example_inputs = list(example_inputs)
        self.settings, self.compile_rest = settings, compile_rest
        self.rest_compiled = rest_compiled  # the rest is compiled (inductor): variants are also timed run as is
        self.dynamic = any(isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and _symbolic(x))
                           for x in example_inputs)
        trial = captured
        self.found: List[Found] = rewrite(trial, parameters(trial, example_inputs), settings)
        for match in self.found:
            log.info("fusor: %s replaces %s", match.region.id, match.region.source)
        self.trial: Optional[Callable[..., Any]] = compile_rest(trial, self.example_inputs) if self.found else None
        self.trial_eager = trial.forward
        self._plain: Optional[Callable[..., Any]] = None
        # What runs, per input shapes; and per the verdicts the regions used, so that shapes whose regions
        # run the same kernels (or the same original ops) share one comparison.
        self.settled: "OrderedDict[Any, Callable[..., Any]]" = OrderedDict()
        self.by_verdicts: Dict[Tuple[Any, ...], Callable[..., Any]] = {}

    def tune_ahead(self) -> None:
        """Runs the graph with every region replaced once on its example inputs, each region waiting for its
        kernel (sizes that are symbolic run at their example values)."""
        assert self.trial is not None
        with torch.no_grad():
            self.trial(*[x.node.hint if isinstance(x, torch.SymInt) else x for x in self.example_inputs])

    def __call__(self, *args: Any) -> Any:
        # Counted as a request: a worker tuning on this machine times its kernels between requests.
        counters = requests()
        with counters if counters is not None else contextlib.nullcontext():
            return self._call(args)

    def _call(self, args: Sequence[Any]) -> Any:
        signature = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        chosen = self.settled.get(signature)
        if chosen is not None:
            self.settled.move_to_end(signature)
            return chosen(*args)
        assert self.trial is not None
        out = self.trial(*args)
        if all(m.region.last != "pending" for m in self.found):
            verdicts = tuple((m.region.last, m.region.last_key) for m in self.found)
            decided = self.by_verdicts.get(verdicts)
            if decided is None:
                try:
                    decided = self._settle(args)
                except Exception as e:  # noqa: BLE001 (a variant that fails to build or run: the graph as captured)
                    log.warning("fusor: this graph runs as captured: comparing its variants failed: %s", e)
                    decided = self.plain()
                if len(self.by_verdicts) >= _KEPT:
                    self.by_verdicts.pop(next(iter(self.by_verdicts)))
                self.by_verdicts[verdicts] = decided
            if len(self.settled) >= _KEPT:
                self.settled.popitem(last=False)
            self.settled[signature] = decided
        return out

    def plain(self) -> Callable[..., Any]:
        """The graph as captured, compiled as the rest is: by a torch.compile of its own (dynamic where the
        captured graph is), so that its guards compile it again for sizes it was not compiled for."""
        if self._plain is None:
            if not self.rest_compiled:
                self._plain = self.captured.forward
            else:
                compile_rest = self.compile_rest
                self._plain = torch.compile(copy.deepcopy(self.captured), dynamic=self.dynamic,
                                            backend=lambda gm, inputs: compile_rest(gm, inputs))
        return self._plain

    def _variant(self, winners: List[int], compiled: bool = True) -> Callable[..., Any]:
        """The graph with only the `winners`-th regions running their kernels (the others run their original
        ops), compiled as the rest is (or run as is); without winners, the graph as captured."""
        if not winners:
            return self.plain() if compiled else self.captured.forward
        graph = self.trial if compiled else self.trial_eager
        assert graph is not None
        allowed = frozenset(self.found[i].region.id for i in winners)
        if len(allowed) == len(self.found):
            return graph
        return lambda *args: only(allowed, graph, *args)

    def _settle(self, args: Sequence[Any]) -> Callable[..., Any]:
        """The fastest way to run the graph for `args`' shapes: as captured, or with the chains that won their
        own comparison replaced (all of them, else each chain's winners alone), each compiled as the rest of the
        graph is and, when that is inductor, also run as is (eager SDPA can beat inductor on long sequences).
        The graph as captured, compiled as asked, wins ties. Where the rest runs as is, the region's own
        comparison decides: a region costs nothing at its edges then."""
        winners = [i for i, m in enumerate(self.found) if m.region.last == "fused"]
        if not self.rest_compiled:
            label = "fused" if winners else "captured, eager"
            DECISIONS.append({"runs": label, "fused_chains": len(winners), "regions": len(self.found), "ms": {}})
            return self._variant(winners, compiled=False)
        groups: Dict[str, List[int]] = {}
        for i in winners:
            groups.setdefault(self.found[i].region.chain, []).append(i)
        subsets: List[List[int]] = [[]] + ([winners] if winners else [])
        later = list(groups.values()) if len(groups) > 1 else []
        times: Dict[Tuple[int, bool], float] = {}
        while True:
            candidates = {(n, compiled): self._variant(subsets[n], compiled)
                          for n in range(len(subsets)) for compiled in (True, False) if (n, compiled) not in times}
            times.update(self._time(candidates, args))
            best = min(times, key=times.__getitem__)
            if best[0] != 0 or not later:
                break
            subsets += later  # every winner together lost: each chain's winners alone
            later = []
        captured = times[(0, True)]
        if times[best] * _MARGIN > captured:
            best = (0, True)
        fused = len(subsets[best[0]])
        label = ("fused" if fused else "captured") + ("" if best[1] else ", eager")
        DECISIONS.append({"runs": label, "fused_chains": fused, "regions": len(self.found),
                          "ms": {("fused" if subsets[n] else "captured") + ("" if c else ", eager") +
                                 (f" ({len(subsets[n])})" if subsets[n] else ""): t * 1e3
                                 for (n, c), t in times.items()}})
        log.info("fusor: this graph runs %s (%d of %d chains fused): %.1f ms against %.1f ms as captured",
                 label, fused, len(self.found), times[best] * 1e3, captured * 1e3)
        return self._variant(subsets[best[0]], best[1])

    @staticmethod
    def _time(candidates: Dict[Any, Callable[..., Any]], args: Sequence[Any]) -> Dict[Any, float]:
        """The median seconds of each candidate on `args`, run in turn, alternating the order each round (2 to 5
        rounds, about _SECONDS for every two candidates; again when the samples of one spread too far)."""
        samples: Dict[Any, List[float]] = {key: [] for key in candidates}
        order = list(candidates)
        devices = {a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"}

        def sync() -> None:  # GPU work is timed to its end, not to its launch
            for device in devices:
                torch.cuda.synchronize(device)

        for attempt in range(2):  # samples that disagree (a busy machine) are measured again
            for i in range(5):
                for key in (order if i % 2 == 0 else order[::-1]):
                    sync()
                    start = time.perf_counter()
                    candidates[key](*args)
                    sync()
                    samples[key].append(time.perf_counter() - start)
                if i >= 1 and sum(map(sum, samples.values())) > _SECONDS * max(1, len(order) / 2) * (attempt + 1):
                    break
            if all((max(v) - min(v)) / statistics.median(v) <= _SPREAD for v in samples.values()):
                break
        return {key: statistics.median(values) for key, values in samples.items()}
