"""Chains written for tensors where they lie: strided views read in place.

A chain input is a dense row-major buffer. A PyTorch view (a head split, a
transposed key, an ``nn.Linear`` weight read as ``[out, in]``, a slice of a
packed QKV projection, a broadcast mask) is the same bytes read with other
strides, so it is written as a dense buffer that starts at the view's first
element, with an affine index per buffer dim: the view's dims sorted by
stride, gaps between them (a slice's left-out part) kept as unused extent, and
broadcast or size-1 dims left out of the index. No byte is copied. The
declared buffer may reach past the tensor's storage (the gap after a slice's
last row): a kernel reads only the elements the index reaches.

The chain writers take sizes and strides only (no tensor library), so the
same writer serves a real call, a traced graph's example values and tests;
each returns the chain text, or raises Unsupported naming why it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "silu")


class Unsupported(Exception):
    """The tensors cannot be read in place by a chain; the message says why."""


@dataclass(frozen=True)
class Access:
    """How a chain reads a strided view: the dense buffer it declares (extents, outermost first), the index of
    each buffer dim in the view's dim names, and, per buffer dim, the view dim whose whole size it is (None: a
    stride's gap, a scaled index)."""

    extents: Tuple[int, ...]
    index: Tuple[str, ...]
    sized: Tuple[Optional[str], ...] = ()

    def declaration(self, name: str, dims: Sequence[str] = ()) -> str:
        """`NAME[e0,e1,...]`: the buffer, each buffer dim that is exactly one of the chain's `dims` declared with
        it (its size then follows the dim's), the others with their integer extents."""
        sized = self.sized or (None,) * len(self.extents)
        return f"{name}[{','.join(d if d is not None and d in dims else str(e) for e, d in zip(self.extents, sized))}]"

    def access(self, name: str) -> str:
        """`NAME[i0,i1,...]`: the buffer read at the view's dims."""
        return f"{name}[{','.join(self.index)}]"



def strided_access(sizes: Sequence[int], strides: Sequence[int], names: Sequence[str]) -> Optional[Access]:
    """The dense buffer and index that read a view of `sizes` and `strides` (in elements) whose dims are
    called `names`, starting at the view's first element; None when no such buffer exists (negative or
    overlapping strides, or a stride that is not a multiple of the next smaller one).

    Each view dim that is read (size above 1, stride not 0) becomes a buffer dim, innermost the smallest
    stride: buffer dim i holds the view dims with strides in [u_i, u_{i+1}), u_0 = 1 and u_i the i-th
    smallest stride, so its extent is u_{i+1} / u_i (what the view skips is unused extent) and the
    innermost dim's index is scaled by its stride when that is not 1."""
    if not (len(sizes) == len(strides) == len(names)):
        raise ValueError("sizes, strides and names must have one entry per dim")
    dims = sorted((int(st), int(sz), nm) for sz, st, nm in zip(sizes, strides, names) if sz > 1 and st != 0)
    if not dims:
        return Access((1,), ("0",), (None,))
    if dims[0][0] < 0:
        return None
    extents: List[int] = []
    index: List[str] = []
    sized: List[Optional[str]] = []
    for i, (stride, size, name) in enumerate(dims):
        unit, coefficient = (1, stride) if i == 0 else (stride, 1)
        reach = coefficient * (size - 1) + 1
        if i + 1 < len(dims):
            following = dims[i + 1][0]
            if following % unit or following // unit < reach:
                return None
            extents.append(following // unit)
        else:
            extents.append(reach)
        index.append(name if coefficient == 1 else f"{name}*{coefficient}")
        sized.append(name if coefficient == 1 and extents[-1] == size else None)
    return Access(tuple(reversed(extents)), tuple(reversed(index)), tuple(reversed(sized)))


@dataclass(frozen=True)
class View:
    """What a chain writer needs of a tensor: its sizes and strides in elements."""

    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]

    @staticmethod
    def of(t: object) -> "View":
        return View(tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()))  # type: ignore[attr-defined]



def _number(x: float) -> str:
    return repr(float(x)) if float(x) == int(x) else f"{x:.9g}"


def _read(view: View, names: Sequence[str], what: str) -> Access:
    access = strided_access(view.sizes, view.strides, names)
    if access is None:
        raise Unsupported(f"{what} {list(view.sizes)} with strides {list(view.strides)} has no affine layout")
    return access


def _split(view: View, dim: int, outer: int) -> View:
    """`view` with dim `dim` split into (outer, size / outer)."""
    size, stride = view.sizes[dim], view.strides[dim]
    inner = size // outer
    return View(view.sizes[:dim] + (outer, inner) + view.sizes[dim + 1:],
                view.strides[:dim] + (stride * inner, stride) + view.strides[dim + 1:])


def _broadcast_to(t: View, lead: Sequence[int], what: str, group_dim: int = -1) -> View:
    """`t` with its leading dims of size 1 broadcast (stride 0) to `lead`; dim `group_dim` keeps its size."""
    sizes, strides = list(t.sizes), list(t.strides)
    for i, size in enumerate(lead):
        if i == group_dim or sizes[i] == size:
            continue
        if sizes[i] != 1:
            raise Unsupported(f"{what} {list(t.sizes)} does not broadcast to the leading dims {list(lead)}")
        sizes[i], strides[i] = size, 0
    return View(tuple(sizes), tuple(strides))


def attention(q: View, k: View, v: View, mask: Optional[View], scale: float, dtype: str,
              out_order: Sequence[int], gqa: bool = False, causal: Optional[int] = None) -> str:
    """softmax(q kᵀ · scale + mask) v for q [..., M, D], k [..., N, D] and v [..., N, Dv] with the same
    leading dims (k and v may broadcast size-1 ones; with `gqa`, k and v have G heads at dim -3 for q's H,
    each read by H / G query heads in a row), and an additive mask of `dtype` already expanded to
    [..., M, N] (broadcast dims with stride 0) or None. With `causal` (an offset c >= 0), query m attends
    to keys n <= m + c only (the kernel skips the rest). The output [..., M, Dv] is written dense in
    `out_order`, a permutation of its dims, outermost first."""
    rank = len(q.sizes)
    if rank < 2 or len(k.sizes) != rank or len(v.sizes) != rank:
        raise Unsupported(f"q, k and v have ranks {len(q.sizes)}, {len(k.sizes)} and {len(v.sizes)}")
    lead, (m, d) = list(q.sizes[:-2]), q.sizes[-2:]
    n, dv = k.sizes[-2], v.sizes[-1]
    if k.sizes[-1] != d or v.sizes[-2] != n:
        raise Unsupported(f"q {list(q.sizes)}, k {list(k.sizes)} and v {list(v.sizes)} do not chain")
    if sorted(out_order) != list(range(rank)):
        raise Unsupported(f"output order {list(out_order)} is not a permutation of {rank} dims")
    head = rank - 3
    grouped = gqa and rank >= 3 and k.sizes[head] != q.sizes[head]
    if grouped:
        groups = k.sizes[head]
        if groups <= 0 or lead[head] % groups or v.sizes[head] != groups:
            raise Unsupported(f"{lead[head]} query heads do not group into {k.sizes[head]} key/value heads")
    k = _broadcast_to(k, lead, "k", head if grouped else -1)
    v = _broadcast_to(v, lead, "v", head if grouped else -1)
    names = [f"z{i}" for i in range(len(lead))]
    extents = dict(zip(names, lead))
    # With grouped heads, q's head dim is (group, r): K and V are read by group, once for each r.
    q_lead = list(names)
    if grouped:
        q = _split(q, head, groups)
        extents[names[head]] = groups
        extents["r"] = lead[head] // groups
        q_lead.insert(head + 1, "r")
        if mask is not None:
            mask = _split(mask, head, groups)
    extents.update(m=m, n=n, d=d, e=dv)
    qa = _read(q, q_lead + ["m", "d"], "q")
    ka = _read(k, names + ["n", "d"], "k")
    va = _read(v, names + ["n", "e"], "v")
    scores = ",".join(q_lead + ["m", "n"])
    decl = [qa.declaration("Q", list(extents)), ka.declaration("K", list(extents)), va.declaration("V", list(extents))]
    logits = f"S[{scores}]"
    if mask is not None:
        ma = _read(mask, q_lead + ["m", "n"], "the mask")
        decl.append(ma.declaration("M", list(extents)))
        logits += " + " + ma.access("M")
    logical = names + ["m", "e"]
    out_dims: List[str] = []
    for i in out_order:
        out_dims += [logical[i], "r"] if grouped and i == head else [logical[i]]
    text = "\n".join([
        "chain fusor_attention",
        f"dtype {dtype}",
        "dim " + " ".join(f"{name}={extent}" for name, extent in extents.items()),
        "in  " + " ".join(decl),
        f"S[{scores}] = sum(d) {qa.access('Q')} * {ka.access('K')} * {_number(scale)}",
        f"P[{scores}] = softmax({_softmax_axis(causal)}) {logits}",
        f"O[{','.join(out_dims)}] = sum(n) P[{scores}] * {va.access('V')}",
        "out O", ""])
    return text


def _softmax_axis(causal: Optional[int]) -> str:
    if causal is None:
        return "n"
    return "n <= m" if causal == 0 else f"n <= m + {causal}"


def _rows(x: View, what: str) -> View:
    """`x` [..., C] as [M, C] rows, when its leading dims merge into one (a view, not a copy)."""
    if len(x.sizes) < 2:
        raise Unsupported(f"{what} {list(x.sizes)} has no rows")
    lead = [(size, st) for size, st in zip(x.sizes[:-1], x.strides[:-1]) if size != 1]
    for (_, outer), (size, inner) in zip(lead, lead[1:]):
        if outer != inner * size:
            raise Unsupported(f"the rows of {what} {list(x.sizes)} with strides {list(x.strides)} do not merge")
    rows = 1
    for size, _ in lead:
        rows *= size
    return View((rows, x.sizes[-1]), (lead[-1][1] if lead else 0, x.strides[-1]))


def ffn(x: View, w1: View, w2: View, dtype: str, activation: Optional[str], b1: bool = False, b2: bool = False,
        up: Optional[View] = None, up_bias: bool = False) -> str:
    """act(x w1 + b1) w2 + b2 for x [..., C] (rows that merge into one dim), w1 [C, F] and w2 [F, O] as
    logical views (an ``nn.Linear`` weight is read as its ``[out, in]`` storage); with `up` [C, F], the
    gated form act(x w1 + b1) * (x up + bu) w2 + b2. The output is [rows, O], dense."""
    if activation is not None and activation not in ACTIVATIONS:
        raise Unsupported(f"activation '{activation}' is not one of {', '.join(ACTIVATIONS)}")
    rows = _rows(x, "x")
    if len(w1.sizes) != 2 or len(w2.sizes) != 2:
        raise Unsupported(f"w1 {list(w1.sizes)} and w2 {list(w2.sizes)} are not matrices")
    (m, c), (c1, f), (f2, o) = rows.sizes, w1.sizes, w2.sizes
    if c1 != c or f2 != f or (up is not None and up.sizes != w1.sizes):
        raise Unsupported(f"x {list(x.sizes)}, w1 {list(w1.sizes)} and w2 {list(w2.sizes)} do not chain")
    xa, wa, w2a = _read(rows, ["m", "c"], "x"), _read(w1, ["c", "f"], "w1"), _read(w2, ["f", "o"], "w2")
    dims = ["m", "c", "f", "o"]
    decl = [xa.declaration("X", dims), wa.declaration("W1", dims)] + ([f"B1[{f}]"] if b1 else [])
    lines = [f"H[m,f] = sum(c) {xa.access('X')} * {wa.access('W1')}"]
    hidden = "H[m,f]" + (" + B1[f]" if b1 else "")
    if activation == "silu":
        hidden = f"({hidden}) * sigmoid({hidden})" if b1 else f"{hidden} * sigmoid({hidden})"
    elif activation is not None:
        hidden = f"{activation}({hidden})"
    if up is not None:
        ua = _read(up, ["c", "f"], "the up projection")
        decl += [ua.declaration("WU", dims)] + ([f"BU[{f}]"] if up_bias else [])
        lines.append(f"U[m,f] = sum(c) {xa.access('X')} * {ua.access('WU')}")
        hidden = f"({hidden}) * " + ("(U[m,f] + BU[f])" if up_bias else "U[m,f]")
    decl += [w2a.declaration("W2", dims)] + ([f"B2[{o}]"] if b2 else [])
    lines.append(f"G[m,f] = {hidden}")
    lines.append(f"Y[m,o] = sum(f) G[m,f] * {w2a.access('W2')}")
    out = "Y"
    if b2:
        lines.append("Z[m,o] = Y[m,o] + B2[o]")
        out = "Z"
    text = "\n".join(["chain fusor_ffn", f"dtype {dtype}", f"dim m={m} c={c} f={f} o={o}", "in  " + " ".join(decl),
                      _constants(decl[1:]), *lines, f"out {out}", ""])
    return text


def _constants(declarations: Sequence[str]) -> str:
    """The chain's `const` line for these inputs (a model's parameters: a kernel may pack them once)."""
    return "const " + " ".join(d.split("[")[0] for d in declarations)


def conv_chain(x: View, w1: View, w2: View, dtype: str, stride: Tuple[int, int], dilation: Tuple[int, int],
               activation: Optional[str], b1: bool = False, b2: bool = False) -> str:
    """conv1x1(act(conv(x, w1) + b1), w2) + b2 for x [N, C, H, W] (already padded), w1 [K, C, R, S] and
    w2 [J, K, 1, 1], any strides; the first convolution with `stride` and `dilation`, one group. The output
    [N, J, P, Q] is dense."""
    if activation is not None and activation not in ACTIVATIONS:
        raise Unsupported(f"activation '{activation}' is not one of {', '.join(ACTIVATIONS)}")
    if len(x.sizes) != 4 or len(w1.sizes) != 4 or len(w2.sizes) != 4 or w2.sizes[2:] != (1, 1):
        raise Unsupported(f"x {list(x.sizes)}, w1 {list(w1.sizes)} and w2 {list(w2.sizes)} are not a conv chain")
    (n, c, height, width), (k, c1, r, s), (j, k2) = x.sizes, w1.sizes, w2.sizes[:2]
    if c1 != c or k2 != k:
        raise Unsupported(f"x {list(x.sizes)}, w1 {list(w1.sizes)} and w2 {list(w2.sizes)} do not chain")
    (sh, sw), (dh, dw) = stride, dilation
    p, q = (height - dh * (r - 1) - 1) // sh + 1, (width - dw * (s - 1) - 1) // sw + 1
    if p < 1 or q < 1:
        raise Unsupported(f"the kernel {r}x{s} does not fit the input {height}x{width}")
    # The input's rows and columns are read at p*sh + r*dh and q*sw + s*dw.
    xa = _read(x, ["n", "c", "y", "x"], "x")
    if any(i not in ("n", "c", "y", "x") for i in xa.index):
        raise Unsupported(f"x {list(x.sizes)} with strides {list(x.strides)} is not dense in its dims")

    def term(name: str, factor: int) -> str:
        return name if factor == 1 else f"{name}*{factor}"

    spatial = {"y": f"{term('p', sh)}+{term('r', dh)}", "x": f"{term('q', sw)}+{term('s', dw)}"}
    access = "I[" + ",".join(spatial.get(i, i) for i in xa.index) + "]"
    wa = _read(w1, ["k", "c", "r", "s"], "w1")
    w2a = _read(View(w2.sizes[:2], w2.strides[:2]), ["j", "k"], "w2")
    dims = ["n", "c", "k", "j", "r", "s"]
    decl = [xa.declaration("I", dims), wa.declaration("W1", dims)] + ([f"B1[{k}]"] if b1 else []) + \
        [w2a.declaration("W2", dims)] + ([f"B2[{j}]"] if b2 else [])
    hidden = "T[n,k,p,q]" + (" + B1[k]" if b1 else "")
    if activation == "silu":
        hidden = f"({hidden}) * sigmoid({hidden})"
    elif activation is not None:
        hidden = f"{activation}({hidden})"
    lines = [f"T[n,k,p,q] = sum(c,r,s) {access} * {wa.access('W1')}", f"U[n,k,p,q] = {hidden}",
             f"O[n,j,p,q] = sum(k) U[n,k,p,q] * {w2a.access('W2')}"]
    out = "O"
    if b2:
        lines.append("Z[n,j,p,q] = O[n,j,p,q] + B2[j]")
        out = "Z"
    text = "\n".join(["chain fusor_conv_chain", f"dtype {dtype}", f"dim n={n} c={c} k={k} j={j} p={p} q={q} r={r} s={s}",
                      "in  " + " ".join(decl), _constants(decl[1:]),
                      *lines, f"out {out}", ""])
    return text
