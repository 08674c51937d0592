"""fusor for PyTorch models: ``torch.compile(model, backend="fusor")``, ``fusor.torch.optimize(model)``, and
helpers that run one chain on tensors.

The backend finds the chains fusor tunes (attention, feed-forward blocks,
convolution chains) in the graphs TorchDynamo captures, replaces each by a
custom operator (``fusor::attention``, ``fusor::ffn``, ``fusor::conv``) that
reads the model's tensors where they lie, and hands the rest of the graph to inductor (or runs it eagerly).
A chain's kernel comes from the scheduler at $FUSOR_SERVER, or from an
embedded one, cache first, and is used only once it has been compared with
the ops it replaces, on the model's own tensors, and won; until then, and
wherever it loses, the original ops run. Inference only: under autograd the
backend leaves the graph as it is.

    import torch, fusor.torch
    model = torch.compile(model, backend="fusor")
    with torch.inference_mode():
        model(**inputs)            # the original ops answer while the chains are tuned
    fusor.torch.wait()             # the tuned kernels are compared at their next call
    print(fusor.torch.report())

The helpers :func:`attention` and :func:`gemm_chain` compile their chain on
first use (waiting for it) and run it on the tensors given.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ._dispatch import DECISIONS, GraphRunner
from ._helpers import ACTIVATIONS, attention, gemm_chain, kernel, set_client, set_tuning_cores
from ._runtime import VERDICTS, Settings

__all__ = ["ACTIVATIONS", "attention", "backend", "gemm_chain", "graphs", "kernel", "optimize", "report", "set_client",
           "wait"]

log = logging.getLogger("fusor.torch")
_said: set = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("fusor: %s", message)


def _options(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    known: Dict[str, Any] = {"rest": "inductor", "tune": "background", "budget": 0, "rounds": 7,
                             "tune_seconds": None, "tune_cores": None}
    given = dict(options or {})
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown fusor backend options {unknown}; known: {sorted(known)}")
    known.update(given)
    if known["rest"] not in ("inductor", "eager"):
        raise ValueError(f"rest must be 'inductor' or 'eager', got {known['rest']!r}")
    if known["tune"] not in ("background", "ahead"):
        raise ValueError(f"tune must be 'background' or 'ahead', got {known['tune']!r}")
    for name in ("tune_seconds", "tune_cores"):
        value = known[name]
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a positive number or None, got {value!r}")
    return known


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: Optional[str] = None,
            options: Optional[Dict[str, Any]] = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend "fusor" (``mode`` is not used). Options (``options={...}``):

    - ``rest``: "inductor" (default) compiles the rest of the graph with inductor; "eager" runs it as is.
    - ``tune``: "background" (default): a chain met for the first time is tuned on a background thread while
      the original ops answer; "ahead": compiling runs the graph once on its example inputs, waiting for
      every chain's kernel.
    - ``budget``: candidates measured per chain (0: the scheduler's default). ``rounds``: timing rounds of
      the comparison of a kernel with the original ops.
    - ``tune_seconds``: the wall time background tuning may take in this process (default: no cap); once
      spent, chains not tuned yet keep their original ops. ``tune_cores``: the cores the embedded worker may
      use (default: all; it runs at the lowest CPU priority and times kernels between this process's
      requests either way). Neither applies to a scheduler at $FUSOR_SERVER, which tunes elsewhere.
    """
    opts = _options(options)
    settings = Settings(tune=opts["tune"], budget=int(opts["budget"]), rounds=int(opts["rounds"]),
                        tune_seconds=opts["tune_seconds"])
    if opts["tune_cores"] is not None:
        set_tuning_cores(int(opts["tune_cores"]))

    def compile_rest(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        if opts["rest"] == "eager":
            return graph.forward
        from torch._inductor.compile_fx import compile_fx
        compiled: Callable[..., Any] = compile_fx(graph, list(inputs))  # type: ignore[assignment]
        return compiled

    if torch.is_grad_enabled() and (any(isinstance(v, torch.Tensor) and v.requires_grad for v in example_inputs)
                                    or any(p.requires_grad for p in gm.parameters())):
        _say_once("the graph needs gradients: fusor computes forward passes only and leaves it as it is "
                  "(run the model under torch.inference_mode() or torch.no_grad())")
        return compile_rest(gm, example_inputs)
    runner = GraphRunner(gm, example_inputs, settings, compile_rest, rest_compiled=opts["rest"] == "inductor")
    if not runner.found:
        return compile_rest(gm, example_inputs)
    if settings.tune == "ahead":
        runner.tune_ahead()
    return runner


def optimize(model: torch.nn.Module, **options: Any) -> Callable[..., Any]:
    """`model` with its chains run by fusor and everything else run eagerly: ``torch.compile`` with this
    backend and ``rest="eager"`` (TorchDynamo captures the graphs; nothing else is compiled). Takes the
    backend's options."""
    options.setdefault("rest", "eager")
    _options(options)
    return torch.compile(model, backend=lambda gm, inputs: backend(gm, inputs, options=options))


def wait(timeout: Optional[float] = None) -> bool:
    """Waits for the chains being tuned; False when `timeout` seconds passed first. Each kernel is compared
    with the original ops at its chain's next call."""
    return VERDICTS.wait(timeout)


def report() -> List[Dict[str, Any]]:
    """What became of each chain met so far, at each range of sizes: its name, the regions that run it, state
    ("tuning", "ready": tuned, compared at its next call; "fused": its kernel runs; "unfused": the original ops
    won or the kernel's output differed; "failed"), why, the compared times in microseconds, the text of the
    first call's chain, how the scheduler answered ("answer": "tuned", "covered" by a record of a wider range,
    "transferred" from the same chain at other sizes; "refined": a transferred range tuned again since), the
    range of sizes its kernel serves ("range"), and why the scheduler had no record of the chain's own ("why":
    the nearest record and what differs)."""
    return [{"chain": v.name, "regions": list(v.regions), "state": v.state, "reason": v.reason,
             "kernel_us": v.kernel_us, "original_us": v.original_us, "error": v.error, "text": v.chain,
             "answer": v.answer, "refined": v.refined, "range": v.served, "why": v.why}
            for v in VERDICTS.all()]


def graphs() -> List[Dict[str, Any]]:
    """What each captured graph settled on, per input shapes, once its chains were decided: what runs from
    then on ("captured", "fused", or either with ", eager" when running it as is beat inductor), how many
    of its chains ("regions") that fuses ("fused_chains"), and the median ms of every variant timed on
    the call's inputs ("ms")."""
    return [dict(d) for d in DECISIONS]


try:  # `backend="fusor"`: also found through the package's torch_dynamo_backends entry point
    from torch._dynamo import list_backends, register_backend

    if "fusor" not in list_backends(exclude_tags=()):
        register_backend(backend, name="fusor")
except Exception:  # noqa: BLE001 (an older or newer dynamo: the entry point still names it)
    pass
