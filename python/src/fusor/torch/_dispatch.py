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

import copy
import logging
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.fx as fx

from ._graph import Found, rewrite
from ._runtime import Settings

log = logging.getLogger("fusor.torch")

# How much faster the graph with fusor's regions must be than the graph as captured to be kept.
_MARGIN = 1.02
# What each graph settled on, for fusor.torch.graphs().
DECISIONS: List[Dict[str, Any]] = []
# Samples of one variant further apart than this (relative to their median) are measured again, once.
_SPREAD = 0.5
# About how long the comparison of the two graphs may take (at least 2 rounds, at most 5).
_SECONDS = 2.0


def parameters(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Set[fx.Node]:
    """The nodes of `gm` that hold parameters (constants): placeholders given a Parameter, and attributes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {n for n, value in zip(placeholders, example_inputs) if isinstance(value, torch.nn.Parameter)}
    return params | {n for n in gm.graph.nodes if n.op == "get_attr"}


class GraphRunner:
    """Runs a captured graph: with every region found replaced until they settle, then, per input shapes,
    the fastest of the graph as captured and the graphs with winning regions replaced (see _settle)."""

    def __init__(self, captured: fx.GraphModule, example_inputs: Sequence[Any], settings: Settings,
                 compile_rest: Callable[[fx.GraphModule], Callable[..., Any]], also_eager: bool = False):
        self.captured = copy.deepcopy(captured)
        self.example_inputs = list(example_inputs)
        self.settings, self.compile_rest = settings, compile_rest
        self.also_eager = also_eager  # also try the graph variants run as is (the rest is compiled)
        trial = captured
        self.found: List[Found] = rewrite(trial, parameters(trial, example_inputs), settings)
        for match in self.found:
            log.info("fusor: %s replaces %s", match.region.id, match.region.source)
        self.trial: Optional[Callable[..., Any]] = compile_rest(trial) if self.found else None
        self._plain: Optional[Callable[..., Any]] = None
        self._variants: Dict[Tuple[frozenset, bool], Callable[..., Any]] = {}
        self.settled: Dict[Any, Callable[..., Any]] = {}

    def tune_ahead(self) -> None:
        """Runs the graph with every region replaced once on its example inputs, each region waiting for its
        kernel (sizes that are symbolic run at their example values)."""
        assert self.trial is not None
        with torch.no_grad():
            self.trial(*[x.node.hint if isinstance(x, torch.SymInt) else x for x in self.example_inputs])

    def __call__(self, *args: Any) -> Any:
        signature = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        chosen = self.settled.get(signature)
        if chosen is not None:
            return chosen(*args)
        assert self.trial is not None
        out = self.trial(*args)
        if all(m.region.last != "pending" for m in self.found):
            try:
                self.settled[signature] = self._settle(args)
            except Exception as e:  # noqa: BLE001 (a variant that fails to build or run: the graph as captured)
                log.warning("fusor: this graph runs as captured: comparing its variants failed: %s", e)
                self.settled[signature] = self.plain()
        return out

    def plain(self) -> Callable[..., Any]:
        if self._plain is None:
            self._plain = self.compile_rest(copy.deepcopy(self.captured))
        return self._plain

    def _variant(self, winners: List[int], compiled: bool = True) -> Callable[..., Any]:
        """The captured graph with the `winners`-th chains replaced, compiled as the rest is (or run as is)."""
        if not winners and compiled:
            return self.plain()
        key = (frozenset(winners), compiled)
        if key not in self._variants:
            gm = copy.deepcopy(self.captured)
            if winners:
                rewrite(gm, parameters(gm, self.example_inputs), self.settings, keep=winners)
            self._variants[key] = self.compile_rest(gm) if compiled else gm.forward
        return self._variants[key]

    def _settle(self, args: Sequence[Any]) -> Callable[..., Any]:
        """The fastest way to run the graph for `args`' shapes: as captured, or with the chains that won their
        own comparison replaced (all of them, else each chain's alone), each compiled as the rest of the graph
        is and, when that is inductor, also run as is (eager SDPA can beat inductor on long sequences). The
        graph as captured, compiled as asked, wins ties."""
        winners = [i for i, m in enumerate(self.found) if m.region.last == "fused"]
        groups: Dict[str, List[int]] = {}
        for i in winners:
            groups.setdefault(self.found[i].region.chain, []).append(i)
        subsets: List[List[int]] = [[]] + ([winners] if winners else [])
        later = list(groups.values()) if len(groups) > 1 else []
        modes = [True, False] if self.also_eager else [True]
        times: Dict[Tuple[int, bool], float] = {}
        while True:
            candidates = {(n, compiled): self._variant(subsets[n], compiled)
                          for n in range(len(subsets)) for compiled in modes if (n, compiled) not in times}
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
        return self._variant(subsets[best[0]], best[1]) if best != (0, True) else self.plain()

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
