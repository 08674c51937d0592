"""What the backend hands back for one captured graph: never slower than the graph as captured.

A region's own comparison (see _runtime) says whether its kernel beats the ops it replaces, but a region
also costs at its edges: the rest of the graph cannot fuse into it (a bias and a residual add before a
layer norm, say), and each call passes through Python. So once every region of the graph has settled
for the inputs' shapes, the graph with only the winning regions replaced is compiled, and it is timed
against the graph as captured (compiled the same way), alternating, on that call's inputs. The faster
one answers for those shapes from then on; on a tie the graph as captured does.
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
# About how long the comparison of the two graphs may take (at least 2 rounds, at most 5).
_SECONDS = 2.0


def parameters(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Set[fx.Node]:
    """The nodes of `gm` that hold parameters (constants): placeholders given a Parameter, and attributes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {n for n, value in zip(placeholders, example_inputs) if isinstance(value, torch.nn.Parameter)}
    return params | {n for n in gm.graph.nodes if n.op == "get_attr"}


class GraphRunner:
    """Runs a captured graph: with every region found replaced until they settle, then, per input shapes,
    the faster of the graph with the winning regions replaced and the graph as captured."""

    def __init__(self, captured: fx.GraphModule, example_inputs: Sequence[Any], settings: Settings,
                 compile_rest: Callable[[fx.GraphModule], Callable[..., Any]]):
        self.captured = copy.deepcopy(captured)
        self.example_inputs = list(example_inputs)
        self.settings, self.compile_rest = settings, compile_rest
        trial = captured
        self.found: List[Found] = rewrite(trial, parameters(trial, example_inputs), settings)
        for match in self.found:
            log.info("fusor: %s replaces %s", match.region.id, match.region.source)
        self.trial: Optional[Callable[..., Any]] = compile_rest(trial) if self.found else None
        self._plain: Optional[Callable[..., Any]] = None
        self._variants: Dict[frozenset, Callable[..., Any]] = {}
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
            self.settled[signature] = self._settle(args)
        return out

    def plain(self) -> Callable[..., Any]:
        if self._plain is None:
            self._plain = self.compile_rest(copy.deepcopy(self.captured))
        return self._plain

    def _variant(self, winners: List[int]) -> Callable[..., Any]:
        key = frozenset(winners)
        if key not in self._variants:
            gm = copy.deepcopy(self.captured)
            rewrite(gm, parameters(gm, self.example_inputs), self.settings, keep=winners)
            self._variants[key] = self.compile_rest(gm)
        return self._variants[key]

    def _settle(self, args: Sequence[Any]) -> Callable[..., Any]:
        winners = [i for i, m in enumerate(self.found) if m.region.last == "fused"]
        plain = self.plain()
        if not winners:
            DECISIONS.append({"fused_chains": 0, "regions": len(self.found), "fused_ms": 0.0, "captured_ms": 0.0,
                              "runs": "captured"})
            log.info("fusor: no region of this graph pays for these shapes: the graph runs as captured")
            return plain
        # The graph with every winner replaced, then (when that loses and the winners run several chains) with
        # the winners of one chain each: an attention may pay where a feed-forward block does not.
        groups: Dict[str, List[int]] = {}
        for i in winners:
            groups.setdefault(self.found[i].region.chain, []).append(i)
        tries = [winners] + (list(groups.values()) if len(groups) > 1 else [])
        best: Optional[Dict[str, Any]] = None
        for subset in tries:
            fused_s, plain_s = self._time(self._variant(subset), plain, args)
            if best is None or plain_s / fused_s > best["ratio"]:
                best = {"subset": subset, "ratio": plain_s / fused_s, "fused_s": fused_s, "plain_s": plain_s}
            if best["ratio"] >= _MARGIN and subset is winners:
                break
        assert best is not None
        kept = best["ratio"] >= _MARGIN
        DECISIONS.append({"fused_chains": len(best["subset"]), "regions": len(self.found),
                          "fused_ms": best["fused_s"] * 1e3, "captured_ms": best["plain_s"] * 1e3,
                          "runs": "fused" if kept else "captured"})
        if kept:
            log.info("fusor: this graph with %d fused chains: %.2fx the graph as captured", len(best["subset"]),
                     best["ratio"])
            return self._variant(best["subset"])
        log.info("fusor: the graph as captured is as fast or faster (%.1f ms against %.1f ms with %d fused "
                 "chains): it runs as captured", best["plain_s"] * 1e3, best["fused_s"] * 1e3, len(best["subset"]))
        return plain

    @staticmethod
    def _time(variant: Callable[..., Any], plain: Callable[..., Any], args: Sequence[Any]) -> Tuple[float, float]:
        """Median seconds of `variant` and `plain` on `args`, alternating (2 to 5 rounds, about _SECONDS)."""
        runs: List[List[float]] = [[], []]
        for i in range(5):
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                start = time.perf_counter()
                (variant if which == 0 else plain)(*args)
                runs[which].append(time.perf_counter() - start)
            if i >= 1 and sum(runs[0]) + sum(runs[1]) > _SECONDS:
                break
        return statistics.median(runs[0]), statistics.median(runs[1])
