"""Finding chains in a captured graph, and replacing each by one fusor operator.

Works on the graphs TorchDynamo captures (torch functions, tensor methods and
operators, before decomposition), so it sees the model as written:

- attention: ``scaled_dot_product_attention`` (mask, ``is_causal``, scale,
  ``enable_gqa``), and matmul (``@``, ``torch.matmul``, ``bmm``) of q and kᵀ,
  a scale (multiply or divide by a number), an additive mask, a softmax over
  the last dim, dropout in eval mode or a cast to the same dtype, and a matmul
  by v; then the permutes, transposes, reshapes and ``contiguous`` that merge
  the heads, which the kernel writes directly;
- feed-forward blocks: ``linear``, ``addmm`` or ``matmul`` by a parameter,
  any elementwise activation (recognized by what it computes, so GELU written
  out with ``tanh`` as GPT-2 does is GELU), optionally times a second
  projection of the same input (gated FFNs: SwiGLU, GeGLU), then a second
  projection by a parameter; reshapes of the rows in between are looked
  through.

Every intermediate must be used only inside the chain, or the chain is left
alone.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.fx as fx

from ._runtime import _ACTIVATIONS, AttentionRegion, ConvRegion, FfnRegion, Region, Settings

log = logging.getLogger("fusor.torch")

_MATMUL = {"matmul", "bmm", "__matmul__"}
_LAYOUT = {"transpose", "permute", "contiguous", "reshape", "view", "flatten"}
_ROW_VIEWS = {"view", "reshape", "flatten", "unflatten", "contiguous"}
_ELEMENTWISE = {"mul", "add", "sub", "truediv", "div", "pow", "tanh", "sigmoid", "erf", "exp", "neg", "relu",
                "gelu", "silu", "__mul__", "__add__", "__rmul__", "__radd__", "__truediv__", "__sub__", "__pow__"}
_IDENTITY = {"dropout", "to", "type", "type_as", "float", "contiguous"}


def _name(node: Any) -> Optional[str]:
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", None)
    return None


def _args(node: fx.Node) -> List[Any]:
    return list(node.args)


def _kwargs(node: fx.Node) -> Dict[str, Any]:
    return dict(node.kwargs)


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(_args(node)) > index:
        return _args(node)[index]
    return _kwargs(node).get(name, default)


def _value(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return node
    return node.meta.get("example_value", node.meta.get("val"))


def _hint(x: Any) -> Any:
    """An int of a concrete or symbolic size (its example value)."""
    if isinstance(x, torch.SymInt):
        return x.node.hint
    return x


def _only_user(node: fx.Node) -> Optional[fx.Node]:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass
class Found:
    """A chain found in the graph: its region, the operator and its tensor arguments, the node whose value
    it gives, and the nodes it replaces."""

    region: Region
    op: Any
    operands: Tuple[Any, ...]
    end: fx.Node
    nodes: List[fx.Node]


class Finder:
    """Finds the chains of one graph. `params`: the nodes that hold parameters (constants)."""

    def __init__(self, gm: fx.GraphModule, params: Set[fx.Node], settings: Settings):
        self.gm, self.params, self.settings = gm, params, settings
        self.taken: Set[fx.Node] = set()

    def find(self) -> List[Found]:
        found: List[Found] = []
        for node in list(self.gm.graph.nodes):
            if node in self.taken:
                continue
            name = _name(node)
            match = None
            if name == "scaled_dot_product_attention":
                match = self._sdpa(node)
            elif name == "softmax":
                match = self._softmax_attention(node)
            elif self._projection(node) is not None:
                match = self._ffn(node)
            elif self._convolution(node) is not None:
                match = self._conv(node)
            if match is not None:
                self.taken.update(match.nodes)
                found.append(match)
        return found

    # Attention.
    def _sdpa(self, node: fx.Node) -> Optional[Found]:
        q, k, v = (_args(node) + [None] * 3)[:3]
        mask = _arg(node, 3, "attn_mask")
        dropout, causal = _arg(node, 4, "dropout_p", 0.0), _arg(node, 5, "is_causal", False)
        scale, gqa = _kwargs(node).get("scale"), _kwargs(node).get("enable_gqa", False)
        if not all(isinstance(t, fx.Node) for t in (q, k, v)) or dropout != 0 or not isinstance(causal, bool) \
                or not isinstance(gqa, bool) or not (scale is None or _number(scale)) \
                or not (mask is None or isinstance(mask, fx.Node)) or (causal and mask is not None):
            return None
        assert isinstance(q, fx.Node) and isinstance(k, fx.Node) and isinstance(v, fx.Node)
        return self._attention(node, [node], "sdpa", q, k, v, mask, scale, causal, gqa, False)

    def _softmax_attention(self, softmax: fx.Node) -> Optional[Found]:
        x = _args(softmax)[0] if _args(softmax) else _kwargs(softmax).get("input")
        dim = _arg(softmax, 1, "dim")
        rank = len(_value(softmax).shape) if _value(softmax) is not None else 0
        if not isinstance(x, fx.Node) or dim not in (-1, rank - 1) or _kwargs(softmax).get("dtype") not in (
                None, _value(softmax).dtype):
            return None
        nodes = [softmax]
        # After the softmax: dropout in eval mode or casts to its own dtype, then the matmul by v.
        p = softmax
        user = _only_user(p)
        while user is not None and _name(user) in _IDENTITY and _args(user)[0] is p and self._identity(user):
            nodes.append(user)
            p, user = user, _only_user(user)
        product = _product(user) if user is not None else None
        if user is None or product is None or product[0] is not p or product[2]:
            return None
        pv, v = user, product[1]
        # Before it: an optional mask (added, or a boolean one filled in), an optional scale, q·kᵀ.
        mask, mask_mode, fill = None, "add", 0.0
        name = _name(x)
        if name in ("add", "__add__") and len(_args(x)) == 2 and _only_user(x) is softmax:
            a, b = _args(x)
            if isinstance(a, fx.Node) and self._scores(a) is not None and isinstance(b, fx.Node):
                nodes.append(x)
                x, mask = a, b
            elif isinstance(b, fx.Node) and self._scores(b) is not None and isinstance(a, fx.Node):
                nodes.append(x)
                x, mask = b, a
            else:
                return None
        elif name == "masked_fill" and len(_args(x)) == 3 and _only_user(x) is softmax and _fill(_args(x)[2]):
            nodes.append(x)
            x, mask, mask_mode, fill = _args(x)[0], _args(x)[1], "fill", _args(x)[2]
        elif name == "where" and len(_args(x)) == 3 and _only_user(x) is softmax and _fill(_args(x)[2]):
            nodes.append(x)
            mask, x, mask_mode, fill = _args(x)[0], _args(x)[1], "keep", _args(x)[2]
        if not isinstance(x, fx.Node) or (mask is not None and not isinstance(mask, fx.Node)):
            return None
        scores = self._scores(x)
        if scores is None:
            return None
        qk, scale, scaling = scores
        nodes += scaling + [qk]
        q, k, swapped = _product(qk)  # type: ignore[misc]
        if any(_only_user(n) is None for n in nodes if n is not softmax) or _only_user(softmax) is None:
            return None
        nodes.append(pv)
        k_transposed = not swapped  # the k operand is [..., D, N]
        if k_transposed and self._transposes_last(k) and _only_user(k) is qk:  # q @ k.transpose(-1, -2)
            nodes.append(k)
            k, k_transposed = _args(k)[0], False
        return self._attention(pv, nodes, "matmul", q, k, v, mask, scale, False, False, k_transposed, mask_mode,
                               fill)

    @staticmethod
    def _transposes_last(node: fx.Node) -> bool:
        value = _value(node)
        if _name(node) != "transpose" or value is None or len(_args(node)) != 3:
            return False
        dims = {d % value.dim() for d in _args(node)[1:] if isinstance(d, int)}
        return dims == {value.dim() - 1, value.dim() - 2}

    def _identity(self, node: fx.Node) -> bool:
        name = _name(node)
        if name == "dropout":
            training = _arg(node, 2, "training", True) if node.op == "call_function" else True
            return training is False or _arg(node, 1, "p", 0.5) == 0
        before, after = _value(_args(node)[0]), _value(node)
        return before is not None and after is not None and before.dtype == after.dtype

    def _scores(self, x: fx.Node) -> Optional[Tuple[fx.Node, Optional[float], List[fx.Node]]]:
        """(q·kᵀ matmul, scale, the scaling nodes) of scores `x`: the matmul, times or divided by numbers."""
        scale, scaling = 1.0, []
        while _name(x) in ("mul", "__mul__", "truediv", "div", "__truediv__") and len(_args(x)) == 2:
            a, b = _args(x)
            name = _name(x)
            if isinstance(a, fx.Node) and _number(b):
                scale = scale * b if "mul" in str(name) else scale / b
                scaling.append(x)
                x = a
            elif isinstance(b, fx.Node) and _number(a) and "mul" in str(name):
                scale *= a
                scaling.append(x)
                x = b
            else:
                return None
        if _product(x) is None:
            return None
        return x, (scale if scaling else None), scaling

    def _attention(self, end: fx.Node, nodes: List[fx.Node], form: str, q: fx.Node, k: fx.Node, v: fx.Node,
                   mask: Optional[fx.Node], scale: Optional[float], causal: bool, gqa: bool,
                   k_transposed: bool, mask_mode: str = "add", fill: float = 0.0) -> Optional[Found]:
        logical = _value(end)
        if logical is None or logical.dim() < 2:
            return None
        k, v = self._appended(k, nodes), self._appended(v, nodes)
        tail, order, groups = self._merge_heads(end, tuple(_hint(s) for s in logical.shape))
        region = AttentionRegion(self._source(nodes + tail), self.settings, form=form, scale=scale, causal=causal,
                                 gqa=gqa, k_transposed=k_transposed, out_order=order, out_groups=groups,
                                 mask_mode=mask_mode, fill=fill)
        final = tail[-1] if tail else end
        return Found(region, torch.ops.fusor.attention.default, (q, k, v, mask), final, nodes + tail)

    def _appended(self, node: fx.Node, nodes: List[fx.Node]) -> fx.Node:
        """`node`, or what it appends to empty tensors (an empty KV cache: cat([empty, k])), read in place."""
        if _name(node) != "cat" or _only_user(node) is None or not _args(node):
            return node
        parts = _args(node)[0]
        if not isinstance(parts, (list, tuple)):
            return node
        full = [p for p in parts if not (isinstance(p, fx.Node) and _value(p) is not None and _value(p).numel() == 0)]
        if len(full) != 1 or not isinstance(full[0], fx.Node):
            return node
        nodes.append(node)
        return full[0]

    def _merge_heads(self, end: fx.Node, shape: Tuple[int, ...]) -> Tuple[List[fx.Node], Tuple[int, ...], Tuple[int, ...]]:
        """The layout ops after `end` (single users, up to the longest run that ends as a permutation of the
        output's dims merged in runs) and that permutation and merge, found by replaying them on an index
        tensor; none when they do not end so."""
        run: List[fx.Node] = []
        node = end
        while True:
            user = _only_user(node)
            if user is None or _name(user) not in _LAYOUT or _args(user)[0] is not node:
                break
            run.append(user)
            node = user
        numel = math.prod(shape)
        identity = (tuple(range(len(shape))), tuple(1 for _ in shape))
        if numel == 0 or numel > 1 << 22:
            return [], *identity
        for length in range(len(run), 0, -1):
            layout = _replay(run[:length], shape, numel)
            if layout is not None:
                return run[:length], *layout
        return [], *identity

    # Feed-forward blocks.
    def _projection(self, node: fx.Node) -> Optional[Tuple[fx.Node, fx.Node, Optional[fx.Node], bool]]:
        """(x, weight, bias, transposed) of a projection by a parameter: linear (weight [out, in]), addmm or
        matmul (weight [in, out])."""
        name = _name(node)
        if name == "linear" and node.op == "call_function" and len(_args(node)) >= 2:
            x, w, b = _args(node)[0], _args(node)[1], _arg(node, 2, "bias")
            if w in self.params and (b is None or b in self.params) and isinstance(x, fx.Node):
                return x, w, b, True
        if name == "addmm" and node.op == "call_function" and len(_args(node)) == 3 and not _kwargs(node):
            b, x, w = _args(node)
            if w in self.params and b in self.params and isinstance(x, fx.Node):
                return x, w, b, False
        if name in _MATMUL and len(_args(node)) == 2 and _args(node)[1] in self.params:
            value = _value(_args(node)[1])
            if value is not None and value.dim() == 2 and isinstance(_args(node)[0], fx.Node):
                return _args(node)[0], _args(node)[1], None, False
        return None

    def _ffn(self, first: fx.Node) -> Optional[Found]:
        x, w1, b1, transposed = self._projection(first)  # type: ignore[misc]
        nodes = [first]
        activated = self._activation_after(self._skip_rows(first, nodes), nodes)
        if activated is None:
            return None
        act_end, activation = activated
        wu = bu = None
        after = _only_user(act_end)
        if after is not None and _name(after) in ("mul", "__mul__") and len(_args(after)) == 2:
            other = _args(after)[1] if _args(after)[0] is act_end else _args(after)[0]
            up = self._projection(other) if isinstance(other, fx.Node) else None
            if up is None or up[0] is not x or up[3] != transposed or _only_user(other) is not after:
                return None
            _, wu, bu, _ = up
            nodes += [other, after]
            act_end = after
        hidden = self._skip_rows(act_end, nodes)
        second = _only_user(hidden)
        projection = self._projection(second) if second is not None else None
        if second is None or projection is None or projection[0] is not hidden or projection[3] != transposed:
            return None
        _, w2, b2, _ = projection
        nodes.append(second)
        before, after = _value(x), _value(second)
        if not self._inside(nodes, second) or before is None or after is None \
                or tuple(before.shape[:-1]) != tuple(after.shape[:-1]):
            return None  # (the operator answers x's rows: a chain that reshapes them in between is left alone)
        region = FfnRegion(self._source(nodes), self.settings, activation=activation, transposed=transposed)
        return Found(region, torch.ops.fusor.ffn.default, (x, w1, b1, w2, b2, wu, bu), second, nodes)

    # Convolution chains.
    def _convolution(self, node: Any, pointwise: bool = False) -> Optional[Tuple[fx.Node, fx.Node, Any, Tuple[Any, ...]]]:
        """(x, weight, bias, (stride, padding, dilation)) of a one-group conv2d by a parameter; with
        `pointwise`, only an unpadded 1x1 one with stride 1."""
        if _name(node) != "conv2d" or node.op != "call_function" or len(_args(node)) < 2:
            return None
        x, w = _args(node)[:2]
        b = _arg(node, 2, "bias")
        stride, padding = _arg(node, 3, "stride", 1), _arg(node, 4, "padding", 0)
        dilation, groups = _arg(node, 5, "dilation", 1), _arg(node, 6, "groups", 1)
        padding = 0 if padding == "valid" else padding
        if w not in self.params or not (b is None or b in self.params) or groups != 1 or not isinstance(x, fx.Node) \
                or not all(isinstance(v, int) or (isinstance(v, (list, tuple)) and len(v) == 2 and
                                                   all(isinstance(e, int) for e in v))
                           for v in (stride, padding, dilation)):
            return None
        value = _value(w)
        if value is None or value.dim() != 4:
            return None
        if pointwise and (tuple(value.shape[2:]) != (1, 1) or stride not in (1, (1, 1), [1, 1])
                          or padding not in (0, (0, 0), [0, 0])):
            return None
        return x, w, b, (stride, padding, dilation)

    def _conv(self, first: fx.Node) -> Optional[Found]:
        x, w1, b1, (stride, padding, dilation) = self._convolution(first)  # type: ignore[misc]
        nodes = [first]
        activated = self._activation_after(first, nodes)
        if activated is None:
            return None
        act_end, activation = activated
        second = _only_user(act_end)
        pointwise = self._convolution(second, pointwise=True) if second is not None else None
        if second is None or pointwise is None or pointwise[0] is not act_end:
            return None
        _, w2, b2, _ = pointwise
        nodes.append(second)
        if not self._inside(nodes, second):
            return None
        region = ConvRegion(self._source(nodes), self.settings, activation=activation, stride=stride,
                            padding=padding, dilation=dilation)
        return Found(region, torch.ops.fusor.conv.default, (x, w1, b1, w2, b2), second, nodes)

    def _inside(self, nodes: List[fx.Node], end: fx.Node) -> bool:
        members = set(nodes)
        return all(all(u in members for u in n.users) for n in nodes if n is not end)

    def _skip_rows(self, node: fx.Node, nodes: List[fx.Node]) -> fx.Node:
        """`node` after the reshapes of its rows that only it feeds (the last dim kept)."""
        while True:
            user = _only_user(node)
            if user is None or _name(user) not in _ROW_VIEWS or _args(user)[0] is not node:
                return node
            before, after = _value(node), _value(user)
            if before is None or after is None or before.shape[-1] != after.shape[-1]:
                return node
            nodes.append(user)
            node = user

    def _activation_after(self, h: fx.Node, nodes: List[fx.Node]) -> Optional[Tuple[fx.Node, Optional[str]]]:
        """(the node that ends it, its name) of the activation applied to `h`: the elementwise nodes fed by h
        alone (and numbers), up to the one used outside them; (h, None) for none, None for one that is not a
        known activation. Its nodes are added to `nodes`."""
        body, end = self._elementwise(h)
        if end is None:
            return None
        activation = self._activation(h, body, end) if body else None
        if body and activation is None:
            return None
        nodes += body
        return end, activation

    def _elementwise(self, h: fx.Node) -> Tuple[List[fx.Node], Optional[fx.Node]]:
        body: List[fx.Node] = []
        inside = {h}
        frontier = [h]
        while frontier:
            node = frontier.pop()
            for user in node.users:
                if user in inside or _name(user) not in _ELEMENTWISE:
                    continue
                tensors = [a for a in list(_args(user)) + list(_kwargs(user).values()) if isinstance(a, fx.Node)]
                if all(t in inside for t in tensors) and all(_number(a) or isinstance(a, (fx.Node, str)) or a is None
                                                             for a in list(_args(user)) + list(_kwargs(user).values())):
                    inside.add(user)
                    body.append(user)
                    frontier.append(user)
        # The end: the one node with users outside the body (h itself when there is no activation).
        ends = [n for n in [h] + body if any(u not in inside for u in n.users)]
        if len(ends) != 1:
            return body, None
        order = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        return sorted(body, key=order.__getitem__), ends[0]

    def _activation(self, h: fx.Node, body: List[fx.Node], end: fx.Node) -> Optional[str]:
        """The named activation `body` computes of `h`, found by running it on a range of inputs."""
        probe = torch.linspace(-8.0, 8.0, 4001, dtype=torch.float32)
        values: Dict[fx.Node, Any] = {h: probe}
        try:
            for node in body:
                args: Any = fx.node.map_arg(_args(node), lambda n: values[n])
                kwargs: Any = fx.node.map_arg(_kwargs(node), lambda n: values[n])
                target: Any = node.target
                if node.op == "call_method":
                    values[node] = getattr(args[0], str(node.target))(*args[1:], **kwargs)
                else:
                    values[node] = target(*args, **kwargs)
        except Exception:  # noqa: BLE001 (not an activation we can run)
            return None
        result = values[end]
        for name, fn in _ACTIVATIONS.items():
            if torch.allclose(result, fn(probe), rtol=1e-5, atol=2e-5):
                return name
        return None

    def _source(self, nodes: Sequence[fx.Node]) -> str:
        return " ".join(sorted({str(_name(n)) for n in nodes}))


def _fill(value: Any) -> bool:
    """Whether `value` masks a score out: a number of -1e4 or below (-inf included)."""
    return _number(value) and value <= -1e4


def _product(node: Any) -> Optional[Tuple[fx.Node, fx.Node, bool]]:
    """(a, b, swapped) of a batched matrix product a·b: matmul, bmm or @ (b is [..., K, N]), or a two-operand
    einsum that says the same, with b as [..., K, N] or (swapped) [..., N, K]."""
    name = _name(node)
    args = _args(node) if isinstance(node, fx.Node) else []
    if name in _MATMUL and len(args) == 2 and all(isinstance(a, fx.Node) for a in args):
        return args[0], args[1], False
    if name != "einsum" or not args or not isinstance(args[0], str):
        return None
    operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
    equation = args[0].replace(" ", "")
    if len(operands) != 2 or not all(isinstance(o, fx.Node) for o in operands) or "->" not in equation \
            or "." in equation:
        return None
    inputs, out = equation.split("->")
    if inputs.count(",") != 1:
        return None
    a, b = inputs.split(",")
    if not (len(a) == len(b) == len(out) >= 2) or len(set(out)) != len(out):
        return None
    prefix, m, k, n = out[:-2], a[-2], a[-1], out[-1]
    if a[:-2] != prefix or b[:-2] != prefix or out[-2] != m or len({m, k, n} | set(prefix)) != len(prefix) + 3:
        return None
    if b[-2:] == k + n:
        return operands[0], operands[1], False
    if b[-2:] == n + k:
        return operands[0], operands[1], True
    return None


def _replay(run: Sequence[fx.Node], shape: Tuple[int, ...], numel: int) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """The (dim order, merge runs) that the layout ops `run` apply to a dense tensor of `shape`, or None when
    they are not a permutation then a merge of adjacent dims."""
    probe = torch.arange(numel).reshape(shape)
    try:
        for node in run:
            args: Any = tuple(_hint(a) for a in fx.node.map_arg(_args(node)[1:], lambda n: _hint(_value(n))))
            kwargs: Any = fx.node.map_arg(_kwargs(node), lambda n: _hint(_value(n)))
            target: Any = node.target
            if node.op == "call_method":
                probe = getattr(probe, str(node.target))(*args, **kwargs)
            else:
                probe = target(probe, *args, **kwargs)
    except Exception:  # noqa: BLE001
        return None
    final_shape = tuple(probe.shape)
    position = torch.empty(numel, dtype=torch.long)
    position[probe.reshape(-1)] = torch.arange(numel)
    position = position.reshape(shape)
    strides = []
    for d in range(len(shape)):
        unit = [0] * len(shape)
        if shape[d] > 1:
            unit[d] = 1
            strides.append(int(position[tuple(unit)] - position[tuple(0 for _ in shape)]))
        else:
            strides.append(0)
    order = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
    dense = torch.arange(numel).reshape([shape[d] for d in order]).permute(*[order.index(d) for d in range(len(shape))])
    if not torch.equal(dense, position):
        return None
    # The final dims, each a run of the ordered dims (size-1 dims go with any run).
    groups, at = [], 0
    for size in final_shape:
        count, product = 0, 1
        while at + count < len(order) and product < size:
            product *= shape[order[at + count]]
            count += 1
        if product != size:
            return None
        groups.append(count)
        at += count
    while groups and at < len(order) and shape[order[at]] == 1:
        groups[-1] += 1
        at += 1
    if at != len(order):
        return None
    return order, tuple(groups)


def _mask_forms(graph: fx.Graph, found: Sequence[Found]) -> Dict[int, Tuple[fx.Node, bool]]:
    """For each attention region (by id of its match) that reads a mask: the ``fusor::mask_form`` node that reads
    the mask once per pass for every region it masks alike, placed before the first of them to end (so that it
    comes before all), and whether the region is the one whose q and k it reads (its id is set when registered)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    forms: Dict[Tuple[fx.Node, str, str], fx.Node] = {}
    out: Dict[int, Tuple[fx.Node, bool]] = {}
    for match in sorted(found, key=lambda m: order[m.end]):
        region, mask = match.region, match.operands[3] if len(match.operands) > 3 else None
        if not isinstance(region, AttentionRegion) or not isinstance(mask, fx.Node) or region.causal:
            continue
        key = (mask, region.form, region.mask_mode)
        owned = key not in forms
        if owned:
            with graph.inserting_before(match.end):
                forms[key] = graph.call_function(torch.ops.fusor.mask_form.default,
                                                 ("", match.operands[0], match.operands[1], mask))
        out[id(match)] = (forms[key], owned)
    return out


def rewrite(gm: fx.GraphModule, params: Set[fx.Node], settings: Settings,
            keep: Optional[Sequence[int]] = None) -> List[Found]:
    """Replaces the chains found in `gm` (all, or the `keep`-th of them in the order they are found) by their
    fusor operators; returns what was replaced."""
    found = [m for i, m in enumerate(Finder(gm, params, settings).find()) if keep is None or i in keep]
    graph = gm.graph
    replaced: Dict[fx.Node, fx.Node] = {}  # the value of a chain replaced already, read by a later one
    forms = _mask_forms(graph, found)
    for match in found:
        operands = tuple(replaced.get(o, o) if isinstance(o, fx.Node) else o for o in match.operands)
        region_id = match.region.register()
        if id(match) in forms:
            form, owned = forms[id(match)]
            operands = operands + (form,)
            if owned:
                form.args = (region_id,) + form.args[1:]
        with graph.inserting_before(match.end):
            call = graph.call_function(match.op, (region_id, *operands))
        replaced[match.end] = call
        call.meta.update({k: v for k, v in match.end.meta.items() if k not in ("example_value", "val")})
        match.end.replace_all_uses_with(call)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for node in sorted(match.nodes, key=order.__getitem__, reverse=True):
            if not node.users:
                graph.erase_node(node)
    if found:
        graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return found
