"""Chains of operators: read from text or a file, or built in Python.

A chain reaches the scheduler as a ``fusor.v1.Workload``: chain text (the
format of examples/*.fusor), sent as written, or a structured
``fusor.v1.Chain``. Both parse to the same IR and the same canonical key on
the scheduler, which validates the chain and says where it is wrong. This
module reads chain text into a structured chain only where one is needed (a
sweep's entries, a chain's name), and then only its lines.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List, Optional, Sequence, Union

from google.protobuf import json_format

from ._errors import ChainError
from .v1 import workload_pb2

_DTYPES = {"f32": workload_pb2.DTYPE_F32, "f16": workload_pb2.DTYPE_F16, "bf16": workload_pb2.DTYPE_BF16}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_ACCESS = re.compile(r"^\s*([A-Za-z_]\w*)\s*\[([^\]]*)\]\s*(.*)$")
_REDUCTION = re.compile(r"^(sum|softmax)\s*\(([^)]*)\)\s*(.*)$")


def _names(text: str) -> List[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _access(name: str, index: Sequence[str]) -> str:
    return f"{name}[{','.join(index)}]"


def parse_text(text: str) -> workload_pb2.Chain:
    """The structured chain of chain text, line by line (the scheduler checks its meaning)."""
    chain = workload_pb2.Chain()
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        word, _, rest = line.replace("\t", " ").partition(" ")
        rest = rest.strip()
        where = f"line {line_no}"
        if word == "chain":
            if not re.fullmatch(r"[A-Za-z_]\w*", rest):
                raise ChainError(f"{where}: expected a chain name after 'chain', got '{rest}'")
            chain.name = rest
        elif word == "dtype":
            if rest not in _DTYPES:
                raise ChainError(f"{where}: dtype '{rest}' is not f32, f16 or bf16")
            chain.dtype = _DTYPES[rest]
        elif word == "dim":
            pairs = re.findall(r"([A-Za-z_]\w*)\s*=\s*(\S+)", rest)
            if not pairs or re.sub(r"[A-Za-z_]\w*\s*=\s*\S+", "", rest).strip():
                raise ChainError(f"{where}: expected NAME=EXTENT after 'dim', got '{rest}'")
            for name, extent in pairs:
                if not extent.isdigit():
                    raise ChainError(f"{where}: extent of '{name}' is '{extent}', not an integer")
                chain.dims.add(name=name, extent=int(extent))
        elif word == "in":
            decls = re.findall(r"([A-Za-z_]\w*)\s*\[([^\]]*)\]", rest)
            if not decls or re.sub(r"[A-Za-z_]\w*\s*\[[^\]]*\]", "", rest).strip():
                raise ChainError(f"{where}: expected NAME[dims] ... after 'in', got '{rest}'")
            for name, shape in decls:
                chain.inputs.add(name=name, shape=_names(shape))
        elif word == "out":
            names = rest.split()
            if not names:
                raise ChainError(f"{where}: expected an output tensor name after 'out'")
            chain.outputs.extend(names)
        else:
            access = _ACCESS.match(line)
            if not access or not access.group(3).startswith("="):
                raise ChainError(f"{where}: expected a statement (chain, dtype, dim, in, out) or an op "
                                 f"NAME[dims] = expression, got '{line}'")
            op = chain.ops.add(output=access.group(1), index=_names(access.group(2)))
            expr = access.group(3)[1:].strip()
            reduction = _REDUCTION.match(expr)
            if reduction:
                dims = _names(reduction.group(2))
                if reduction.group(1) == "sum":
                    op.kind = workload_pb2.OP_KIND_SUM
                    op.reduce.extend(dims)
                else:
                    if len(dims) != 1:
                        raise ChainError(f"{where}: softmax takes exactly one axis")
                    op.kind = workload_pb2.OP_KIND_SOFTMAX
                    op.axis = dims[0]
                expr = reduction.group(3)
            else:
                op.kind = workload_pb2.OP_KIND_MAP
            if not expr:
                raise ChainError(f"{where}: expected an expression after '='")
            op.expr = expr
    return chain


def render_text(chain: workload_pb2.Chain) -> str:
    """Chain text of a structured chain."""
    lines = [f"chain {chain.name}", f"dtype {_DTYPE_NAMES.get(chain.dtype, 'f32')}",
             "dim " + " ".join(f"{d.name}={d.extent}" for d in chain.dims),
             "in  " + " ".join(_access(t.name, t.shape) for t in chain.inputs)]
    for op in chain.ops:
        head = {workload_pb2.OP_KIND_SUM: f"sum({','.join(op.reduce)}) ",
                workload_pb2.OP_KIND_SOFTMAX: f"softmax({op.axis}) "}.get(op.kind, "")
        lines.append(f"{_access(op.output, op.index)} = {head}{op.expr}")
    lines.append("out " + " ".join(chain.outputs))
    return "\n".join(lines) + "\n"


class Chain:
    """A chain of operators to fuse, as the scheduler receives it.

    Make one with :meth:`parse` (chain text), :meth:`from_file` (a .fusor
    text file, or a JSON ``fusor.v1.Chain``/``Workload``), :class:`ChainBuilder`,
    or :meth:`from_proto`. Chain text is sent as written, so the scheduler's
    errors point at its lines.
    """

    def __init__(self, workload: workload_pb2.Workload):
        if not workload.HasField("text") and not workload.HasField("chain"):
            raise ChainError("the workload has neither chain text nor a chain")
        self._workload = workload
        self._structured: Optional[workload_pb2.Chain] = None

    @classmethod
    def parse(cls, text: str) -> "Chain":
        """A chain from chain text (or the JSON of a ``fusor.v1.Chain`` or ``Workload``); the scheduler checks it."""
        if text.lstrip().startswith("{"):
            return cls._from_json(text, "the JSON text")
        return cls(workload_pb2.Workload(text=text))

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike]) -> "Chain":
        """A chain from a file of chain text or JSON."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ChainError(f"cannot read chain file '{path}': {e.strerror}") from None
        if text.lstrip().startswith("{"):
            return cls._from_json(text, str(path))
        return cls.parse(text)

    @classmethod
    def from_proto(cls, message: Union[workload_pb2.Chain, workload_pb2.Workload]) -> "Chain":
        if isinstance(message, workload_pb2.Chain):
            return cls(workload_pb2.Workload(chain=message))
        return cls(message)

    @classmethod
    def _from_json(cls, text: str, origin: str) -> "Chain":
        workload = workload_pb2.Workload()
        try:
            import json

            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            if "chain" in obj or "text" in obj:
                json_format.ParseDict(obj, workload)
            else:
                json_format.ParseDict(obj, workload.chain)
        except (ValueError, json_format.ParseError) as e:
            raise ChainError(f"{origin}: not a valid fusor.v1.Workload or Chain: {e}") from None
        return cls(workload)

    @property
    def workload(self) -> workload_pb2.Workload:
        """The ``fusor.v1.Workload`` sent to the scheduler."""
        return self._workload

    def structured(self) -> workload_pb2.Chain:
        """The chain as a ``fusor.v1.Chain`` (chain text is read line by line)."""
        if self._structured is None:
            if self._workload.HasField("chain"):
                self._structured = self._workload.chain
            else:
                self._structured = parse_text(self._workload.text)
        return self._structured

    @property
    def name(self) -> str:
        """The chain's name ("" when chain text names none)."""
        if self._workload.HasField("chain"):
            return self._workload.chain.name
        found = re.search(r"^[ \t]*chain[ \t]+([A-Za-z_]\w*)", self._workload.text, re.M)
        return found.group(1) if found else ""

    @property
    def dtype(self) -> str:
        return _DTYPE_NAMES.get(self.structured().dtype, "f32")

    @property
    def text(self) -> str:
        """Chain text: as written when the chain came as text, else rendered."""
        return self._workload.text if self._workload.HasField("text") else render_text(self.structured())

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Chain({self.name!r})"


class ChainBuilder:
    """Builds a chain op by op, e.g. attention::

        c = (ChainBuilder("attention")
             .dim(b=12, m=128, n=128, k=64, h=64)
             .input("Q", "b", "m", "k").input("K", "b", "n", "k").input("V", "b", "n", "h")
             .sum("S[b,m,n]", "k", "Q[b,m,k] * K[b,n,k] * 0.125")
             .softmax("P[b,m,n]", "n", "S[b,m,n]")
             .sum("O[b,m,h]", "n", "P[b,m,n] * V[b,n,h]")
             .output("O")
             .build())
    """

    def __init__(self, name: str, dtype: str = "f32"):
        if dtype not in _DTYPES:
            raise ChainError(f"dtype '{dtype}' is not f32, f16 or bf16")
        self._chain = workload_pb2.Chain(name=name, dtype=_DTYPES[dtype])

    def dim(self, **extents: int) -> "ChainBuilder":
        """Loop dims and their extents, e.g. ``dim(m=128, n=64)``."""
        for name, extent in extents.items():
            self._chain.dims.add(name=name, extent=int(extent))
        return self

    def input(self, name: str, *shape: Union[str, int], constant: bool = False) -> "ChainBuilder":
        """An input tensor; each shape entry is a dim name or an integer. ``constant=True``: the same from call to
        call (a model's weights), which a kernel may pack once (:meth:`fusor.Kernel.prepare`)."""
        self._chain.inputs.add(name=name, shape=[str(s) for s in shape], constant=constant)
        return self

    def _op(self, output: str, kind: int, expr: str, reduce: Sequence[str] = (), axis: str = "") -> "ChainBuilder":
        access = _ACCESS.match(output)
        if not access or access.group(3):
            raise ChainError(f"an op's output is written NAME[dims], not '{output}'")
        self._chain.ops.add(output=access.group(1), index=_names(access.group(2)), kind=kind,
                            reduce=list(reduce), axis=axis, expr=expr)
        return self

    def sum(self, output: str, over: Union[str, Sequence[str]], expr: str) -> "ChainBuilder":
        """``output = sum(over) expr``, e.g. ``sum("C[m,n]", "k", "A[m,k] * B[k,n]")``."""
        return self._op(output, workload_pb2.OP_KIND_SUM, expr, reduce=[over] if isinstance(over, str) else over)

    def softmax(self, output: str, axis: str, expr: str) -> "ChainBuilder":
        """``output = softmax(axis) expr``; a causal softmax's axis carries its condition, e.g. ``"n <= m"``."""
        return self._op(output, workload_pb2.OP_KIND_SOFTMAX, expr, axis=axis)

    def map(self, output: str, expr: str) -> "ChainBuilder":
        """An elementwise op, e.g. ``map("G[m,f]", "gelu(H[m,f] + B[f])")``."""
        return self._op(output, workload_pb2.OP_KIND_MAP, expr)

    def output(self, *names: str) -> "ChainBuilder":
        self._chain.outputs.extend(names)
        return self

    def build(self) -> Chain:
        if not self._chain.ops:
            raise ChainError(f"chain '{self._chain.name}' has no ops")
        if not self._chain.outputs:
            raise ChainError(f"chain '{self._chain.name}' has no outputs (call output(...))")
        chain = workload_pb2.Chain()
        chain.CopyFrom(self._chain)
        return Chain.from_proto(chain)


ChainLike = Union[Chain, ChainBuilder, str, "os.PathLike[str]", workload_pb2.Chain, workload_pb2.Workload]


def as_chain(value: ChainLike) -> Chain:
    """A Chain from chain text, a path to a chain file, a builder, or a proto."""
    if isinstance(value, Chain):
        return value
    if isinstance(value, ChainBuilder):
        return value.build()
    if isinstance(value, (workload_pb2.Chain, workload_pb2.Workload)):
        return Chain.from_proto(value)
    if isinstance(value, os.PathLike):
        return Chain.from_file(value)
    if isinstance(value, str):
        if "\n" in value or value.lstrip().startswith(("chain ", "{")):
            return Chain.parse(value)
        if os.path.exists(value):
            return Chain.from_file(value)
        raise ChainError(f"'{value}' is neither chain text nor a chain file that exists")
    raise ChainError(f"a chain is chain text, a file path, a ChainBuilder or a fusor.v1 proto, not {type(value).__name__}")
