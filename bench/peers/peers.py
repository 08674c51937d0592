#!/usr/bin/env python3
"""fusor's tuned kernel against what a user would run instead, in one process.

For each chain file: fusor's best kernel comes from `fusor compile` (tuning
first on a cache miss), is built with the flags in its metadata and loaded;
the same chain is built for PyTorch eager (as a user writes it: matmul/einsum,
conv2d, softmax, elementwise), PyTorch scaled_dot_product_attention (attention
chains), OpenVINO native (those PyTorch programs through openvino.convert_model,
compiled for the CPU with the chain's precision as INFERENCE_PRECISION_HINT; the
precision its runtime graph executes in is checked and printed),
onnxruntime's CPU provider (com.microsoft MultiHeadAttention for attention;
MatMul/Einsum, Conv, Softmax and elementwise nodes otherwise) and numpy. Every
implementation's output is checked against fusor's float64 reference (`fusor
reference`) before it is timed; then all are timed interleaved, in slices,
until each has run for --seconds, and the medians are compared. PyTorch and
OpenVINO are optional (peers.sh --torch installs both): their rows say "not
installed" without them. The roof printed is the sgemm rate, and for bf16
chains PyTorch's bf16 matmul rate, of the same run.

  bench/peers/peers.py examples/bert_base_attention.fusor examples/gemm_chain.fusor
  bench/peers/peers.py --short --model-only examples/*.fusor   # no timing claim
"""

import argparse
import ctypes
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chains", nargs="+", help="chain files (.fusor text or JSON)")
    p.add_argument("--fusor", default=os.path.join(ROOT, "build", "client", "fusor"), help="the fusor CLI")
    p.add_argument("--db", help="tuning database for `fusor compile` (default: fusor's)")
    p.add_argument("--server", help="scheduler address for `fusor compile` (default: embedded)")
    p.add_argument("--budget", type=int, help="candidates to measure when tuning on a cache miss")
    p.add_argument("--model-only", action="store_true",
                   help="take the cost model's pick (`compile --model-only --target local`): no tuning, no database")
    p.add_argument("--schedule", help="with --model-only and one chain: this schedule instead of the model's pick")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for every implementation")
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per implementation (at least)")
    p.add_argument("--short", action="store_true", help="validate everything, time briefly: no timing claim")
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--compiler", default="c++", help="compiler for fusor's kernel")
    p.add_argument("--keep", help="keep the kernels and reference data in this directory")
    return p.parse_args()


ARGS = parse_args()
# Thread counts before any numerical library loads.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fusor_kernel as fusor_kernel_lib  # noqa: E402
from fusor_kernel import run_cmd  # noqa: E402

try:
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
    torch.set_num_threads(ARGS.threads)
except ImportError:
    torch = None
try:
    import onnx  # noqa: E402
    from onnx import TensorProto, helper  # noqa: E402
    import onnxruntime as ort  # noqa: E402
except ImportError:
    ort = None
try:
    import openvino as ov  # noqa: E402
except ImportError:
    ov = None


# ------------------------------------------------------------ chain model ---

class Affine:
    """constant + sum of coefficient * dim."""

    def __init__(self, terms, const):
        self.terms = terms  # {dim: coef}
        self.const = const

    def plain(self):
        return self.const == 0 and len(self.terms) == 1 and list(self.terms.values())[0] == 1

    def dim(self):
        return next(iter(self.terms))


class Node:
    def __init__(self, kind, **kw):
        self.kind = kind  # const, access, + - * /, neg, call
        self.__dict__.update(kw)


def tokenize(text):
    return re.findall(r"\d+\.\d*(?:[eE][-+]?\d+)?|\d*\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?|[A-Za-z_]\w*|\S", text)


def parse_expr(text):
    toks = tokenize(text)
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take(expect=None):
        t = toks[pos[0]]
        if expect is not None and t != expect:
            raise ValueError("expected %r in %r" % (expect, text))
        pos[0] += 1
        return t

    def affine():
        terms, const, sign = {}, 0, 1
        while True:
            t = take()
            if t == "-":
                sign = -sign
                continue
            if re.match(r"\d", t):
                value = int(t)
                if peek() == "*":
                    take()
                    d = take()
                    terms[d] = terms.get(d, 0) + sign * value
                else:
                    const += sign * value
            else:
                coef = 1
                if peek() == "*":
                    take()
                    coef = int(take())
                terms[t] = terms.get(t, 0) + sign * coef
            sign = 1
            if peek() == "+":
                take()
            elif peek() == "-":
                take()
                sign = -1
            else:
                return Affine({d: c for d, c in terms.items() if c != 0}, const)

    def primary():
        t = take()
        if t == "(":
            e = add()
            take(")")
            return e
        if t == "-":
            return Node("neg", args=[primary()])
        if re.match(r"[\d.]", t):
            return Node("const", value=float(t))
        if peek() == "(":
            take("(")
            e = add()
            take(")")
            return Node("call", func=t, args=[e])
        take("[")
        index = [affine()]
        while peek() == ",":
            take()
            index.append(affine())
        take("]")
        return Node("access", tensor=t, index=index)

    def mul():
        e = primary()
        while peek() in ("*", "/"):
            op = take()
            e = Node(op, args=[e, primary()])
        return e

    def add():
        e = mul()
        while peek() in ("+", "-"):
            op = take()
            e = Node(op, args=[e, mul()])
        return e

    e = add()
    if peek() is not None:
        raise ValueError("trailing %r in %r" % (peek(), text))
    return e


class Chain:
    def __init__(self, j):
        self.name = j["name"]
        self.dtype = j.get("dtype", "f32")
        self.extent = {d["name"]: d["extent"] for d in j["dims"]}
        self.inputs = [t["name"] for t in j["inputs"]]
        # Inputs declared `const` (a model's weights): each peer gets them as it would in a model.
        self.constants = {t["name"] for t in j["inputs"] if t.get("constant")}
        self.outputs = list(j["outputs"])
        self.shape = {}
        for t in j["inputs"]:
            # An axis is a dim's name, or an integer literal (a mask's `1` axis).
            self.shape[t["name"]] = [self.extent[s] if s in self.extent else int(s) for s in t["shape"]]
        self.ops = []
        for o in j["ops"]:
            op = dict(kind=o["kind"], output=o["output"], index=list(o["index"]), reduce=list(o.get("reduce", [])),
                      axis=o.get("axis"), causal=None, body=parse_expr(o["expr"]))
            if op["axis"] and "<=" in op["axis"]:
                # A causal softmax, "n <= m [+ c]": keys past row m + c are dropped.
                axis, row = (x.strip() for x in op["axis"].split("<="))
                row, _, offset = row.partition("+")
                op["axis"], op["causal"] = axis, (row.strip(), int(offset or 0))
            self.shape[op["output"]] = [self.extent[d] for d in op["index"]]
            self.ops.append(op)

    def flops(self):
        """The sums' multiply-adds; under a causal softmax (along n, rows m), those of the sums over both m
        and n only for the keys kept."""
        kept = {}
        for op in self.ops:
            if op["causal"]:
                (m, c), n = op["causal"], op["axis"]
                share = sum(min(self.extent[n], r + c + 1) for r in range(self.extent[m])) / (
                    self.extent[m] * self.extent[n])
                kept[(m, n)] = share
        total = 0
        for op in self.ops:
            if op["kind"] == "sum":
                dims = op["index"] + op["reduce"]
                share = math.prod(f for (m, n), f in kept.items() if m in dims and n in dims)
                total += 2 * math.prod(self.extent[d] for d in dims) * share
        return total


def factors(e, scale=1.0):
    """A product of accesses and constants: (scale, [access nodes]), or None."""
    if e.kind == "const":
        return e.value * scale, []
    if e.kind == "access":
        return scale, [e]
    if e.kind == "neg":
        r = factors(e.args[0], scale)
        return None if r is None else (-r[0], r[1])
    if e.kind == "*":
        a = factors(e.args[0], scale)
        b = factors(e.args[1], 1.0)
        if a is None or b is None:
            return None
        return a[0] * b[0], a[1] + b[1]
    return None


def causal_dropped(lib, chain, op, dims):
    """A causal softmax's dropped keys as a boolean array over `dims` (size 1 along all but its row and
    axis): True where axis > row + offset."""
    row, offset = op["causal"]
    shape = [chain.extent[d] if d in (row, op["axis"]) else 1 for d in dims]
    m = np.arange(chain.extent[row]).reshape([-1 if d == row else 1 for d in dims])
    n = np.arange(chain.extent[op["axis"]]).reshape([-1 if d == op["axis"] else 1 for d in dims])
    dropped = np.broadcast_to(n > m + offset, shape)
    return torch.from_numpy(dropped.copy()) if lib == "torch" else dropped


def attention_pattern(chain):
    """(scale, q, k, v, mask access or None) for S=QK^T*c, P=softmax(S [+M]), O=PV; else None."""
    if len(chain.ops) != 3 or [o["kind"] for o in chain.ops] != ["sum", "softmax", "sum"]:
        return None
    s, p, o = chain.ops
    fs, fo = factors(s["body"]), factors(o["body"])
    if fs is None or fo is None or len(fs[1]) != 2 or len(fo[1]) != 2 or len(s["reduce"]) != 1:
        return None
    if len(o["reduce"]) != 1 or o["reduce"][0] != p["axis"] or chain.outputs != [o["output"]]:
        return None
    q, k = fs[1]
    pv = fo[1]
    if pv[0].tensor != p["output"]:
        pv = pv[::-1]
    if pv[0].tensor != p["output"] or fo[0] != 1.0:
        return None
    v = pv[1]
    # The softmax's input: the scores plus any additive terms (a padding mask, T5's position bias), the
    # terms' sum being the mask.
    terms = []

    def flatten(e):
        if e.kind == "+":
            flatten(e.args[0])
            flatten(e.args[1])
        else:
            terms.append(e)
    flatten(p["body"])
    scores = [e for e in terms if e.kind == "access" and e.tensor == s["output"]]
    if len(scores) != 1:
        return None
    rest = [e for e in terms if e is not scores[0]]
    mask = None
    for e in rest:
        mask = e if mask is None else Node("+", args=[mask, e])
    for a in (q, k, v):
        if not all(x.plain() for x in a.index) or a.tensor not in chain.inputs:
            return None
    batch = s["index"][:-2]
    m, n = s["index"][-2:]
    kd = s["reduce"][0]
    if p["axis"] != n or len(o["index"]) != len(batch) + 2 or (p["causal"] and p["causal"][0] != m):
        return None
    h = next((d for d in o["index"] if d not in batch and d != m), None)
    # Each operand in any axis order (an export's Q[b, m, heads, d]): the
    # permutation to batch + [rows, cols], as a view.
    # K and V may lack batch dims that Q has (grouped heads: K[b, g, n, d]
    # for Q[b, g, r, m, d]): they are broadcast along them.
    perms, broadcast = {}, {}
    for name, a, want in (("q", q, batch + [m, kd]), ("k", k, batch + [n, kd]), ("v", v, batch + [n, h])):
        dims = [x.dim() for x in a.index]
        missing = [d for d in want if d not in dims]
        if len(set(dims)) != len(dims) or not set(dims) <= set(want) or any(d not in batch for d in missing) or \
                (missing and name == "q"):
            return None
        present = [d for d in want if d in dims]
        perms[name] = [dims.index(d) for d in present]
        broadcast[name] = [i for i, d in enumerate(want) if d in missing]
    if sorted(o["index"]) != sorted(batch + [m, h]):
        return None
    out_perm = [(batch + [m, h]).index(d) for d in o["index"]]
    return dict(scale=fs[0], q=q.tensor, k=k.tensor, v=v.tensor, mask=mask, batch=batch, m=m, n=n, k_dim=kd, h=h,
                perms=perms, broadcast=broadcast, out_perm=out_perm, causal=p["causal"], softmax=p)


def attention_operand(lib, chain, att, env, name):
    """Q, K or V as a view in [batch..., seq, size] order (broadcast along the batch dims it lacks)."""
    x = env[att[name]]
    x = x.permute(att["perms"][name]) if lib == "torch" else np.transpose(x, att["perms"][name])
    for axis in att["broadcast"][name]:
        x = x.unsqueeze(axis) if lib == "torch" else np.expand_dims(x, axis)
    want = [chain.extent[d] for d in att["batch"]] + list(x.shape[-2:])
    return x.expand(want) if lib == "torch" else np.broadcast_to(x, want)


def linear_pattern(chain, op, f):
    """Y[rows..., j] = sum(k) X[rows..., k] * W[k, j] (or W[j, k]) with W a constant input: F.linear's form."""
    if f is None or len(f[1]) != 2 or len(op["reduce"]) != 1:
        return None
    k = op["reduce"][0]
    for x, w in (f[1], f[1][::-1]):
        if w.tensor not in chain.constants or len(w.index) != 2 or not all(e.plain() for e in w.index + x.index):
            continue
        wd, xd = [e.dim() for e in w.index], [e.dim() for e in x.index]
        if k not in wd or xd[-1] != k or len(set(xd)) != len(xd):
            continue
        j = wd[0] if wd[1] == k else wd[1]
        if op["index"] != xd[:-1] + [j]:
            continue
        return dict(x=x.tensor, w=w.tensor, w_in_first=wd[0] == k, scale=f[0])
    return None


def conv_pattern(chain, op):
    """A 2-D convolution T[n,k,p,q] = sum(c,r,s) X[n,c,p*sp+r*dp+a,q*sq+s*dq+b] * W[k,c,r,s] (any output order)."""
    f = factors(op["body"])
    if f is None or len(f[1]) != 2:
        return None
    for x, w in (f[1], f[1][::-1]):
        if len(x.index) != 4 or len(w.index) not in (2, 4) or not all(e.plain() for e in w.index):
            continue
        if len(w.index) == 2:  # a 1x1 convolution: W[k,c], X[n,c,p,q]
            if not all(e.plain() for e in x.index) or x.index[1].dim() != w.index[1].dim():
                continue
            n, c, p, q = [e.dim() for e in x.index]
            kk = w.index[0].dim()
            if sorted(op["reduce"]) != [c] or sorted(op["index"]) != sorted([n, kk, p, q]):
                continue
            return dict(scale=f[0], x=x.tensor, w=w.tensor, n=n, k=kk, spatial=[(p, 1, 1, 0), (q, 1, 1, 0)],
                        order=[n, kk, p, q], pointwise=True)
        kk, c, r, s = [e.dim() for e in w.index]
        if not (x.index[0].plain() and x.index[1].plain() and x.index[1].dim() == c):
            continue
        n = x.index[0].dim()
        spatial = []
        for e, red in ((x.index[2], r), (x.index[3], s)):
            outs = [d for d in e.terms if d != red]
            if len(outs) != 1 or red not in e.terms or e.const < 0:
                break
            spatial.append((outs[0], e.terms[outs[0]], e.terms[red], e.const))
        if len(spatial) != 2 or sorted(op["reduce"]) != sorted([c, r, s]):
            continue
        if sorted(op["index"]) != sorted([n, kk, spatial[0][0], spatial[1][0]]):
            continue
        return dict(scale=f[0], x=x.tensor, w=w.tensor, n=n, k=kk, spatial=spatial,
                    order=[n, kk, spatial[0][0], spatial[1][0]])
    return None


# ------------------------------------------------------ array evaluation ---

def strided_view(lib, chain, value, access, dims):
    """The access as a view over `dims` (broadcast along dims it does not use)."""
    shape = chain.shape[access.tensor]
    tstrides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    size, stride = [], []
    offset = sum(e.const * s for e, s in zip(access.index, tstrides))
    for d in dims:
        st = sum(e.terms.get(d, 0) * s for e, s in zip(access.index, tstrides))
        size.append(chain.extent[d] if st != 0 else 1)
        stride.append(st)
    if lib == "torch":
        return torch.as_strided(value.contiguous(), size, stride, offset)
    v = np.ascontiguousarray(value).reshape(-1)[offset:]
    return np.lib.stride_tricks.as_strided(v, size, [s * v.itemsize for s in stride], writeable=False)


def aligned(lib, chain, env, access, dims):
    if all(e.plain() for e in access.index) and len({e.dim() for e in access.index}) == len(access.index):
        used = [e.dim() for e in access.index]
        order = sorted(range(len(used)), key=lambda i: dims.index(used[i]))
        v = env[access.tensor]
        v = v.permute(order) if lib == "torch" else np.transpose(v, order)
        idx = [slice(None) if d in used else None for d in dims]
        return v[tuple(idx)]
    return strided_view(lib, chain, env[access.tensor], access, dims)


def apply_func(lib, name, x):
    if lib == "torch":
        return {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
                "exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[name](x)
    if name == "gelu":
        raise NotImplementedError("numpy has no erf (exact GELU)")
    return {"relu": lambda v: np.maximum(v, 0), "exp": np.exp, "tanh": np.tanh,
            "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3))),
            "sigmoid": lambda v: 1 / (1 + np.exp(-v))}[name](x)


def evaluate(lib, chain, env, e, dims):
    if e.kind == "const":
        return e.value
    if e.kind == "access":
        return aligned(lib, chain, env, e, dims)
    if e.kind == "neg":
        return -evaluate(lib, chain, env, e.args[0], dims)
    if e.kind == "call":
        return apply_func(lib, e.func, evaluate(lib, chain, env, e.args[0], dims))
    a = evaluate(lib, chain, env, e.args[0], dims)
    b = evaluate(lib, chain, env, e.args[1], dims)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[e.kind]()


LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def array_program(lib, chain):
    """fn(inputs) -> outputs for torch or numpy, op by op as a user writes it."""
    letter = {d: LETTERS[i] for i, d in enumerate(chain.extent)}
    steps = []
    for op in chain.ops:
        out, index = op["output"], op["index"]
        if op["kind"] == "sum":
            conv = conv_pattern(chain, op) if lib == "torch" else None
            f = factors(op["body"])
            lin = linear_pattern(chain, op, f) if lib == "torch" else None
            if lin is not None:
                def step(env, op=op, lin=lin, weights={}):
                    # The weight as an nn.Linear holds it, [out, in], laid out once (a model's parameter).
                    w = env[lin["w"]]
                    key = (w.data_ptr(), tuple(w.shape))
                    if key not in weights:
                        weights[key] = (w.t() if lin["w_in_first"] else w).contiguous()
                    y = F.linear(env[lin["x"]], weights[key])
                    return y * lin["scale"] if lin["scale"] != 1 else y
            elif conv is not None:
                def step(env, op=op, cv=conv):
                    x = env[cv["x"]]
                    (p, sp, dp, a), (q, sq, dq, b) = cv["spatial"]
                    x = x[:, :, a:, b:]
                    w = env[cv["w"]]
                    if cv.get("pointwise"):
                        w = w.reshape(w.shape[0], w.shape[1], 1, 1)
                    y = F.conv2d(x, w, stride=(sp, sq), dilation=(dp, dq))
                    y = y[:, :, :chain.extent[p], :chain.extent[q]]
                    if cv["scale"] != 1:
                        y = y * cv["scale"]
                    return y.permute([cv["order"].index(d) for d in op["index"]])
            elif f is not None:
                def step(env, op=op, f=f):
                    operands, specs = [], []
                    for a in f[1]:
                        used = []
                        for e in a.index:
                            for d in e.terms:
                                if d not in used:
                                    used.append(d)
                        operands.append(aligned(lib, chain, env, a, used) if not all(e.plain() for e in a.index)
                                        else env[a.tensor])
                        specs.append("".join(letter[d] for d in used) if not all(e.plain() for e in a.index)
                                     else "".join(letter[e.dim()] for e in a.index))
                    spec = ",".join(specs) + "->" + "".join(letter[d] for d in op["index"])
                    y = torch.einsum(spec, *operands) if lib == "torch" else np.einsum(spec, *operands, optimize=True)
                    return y * f[0] if f[0] != 1 else y
            else:
                def step(env, op=op):
                    dims = op["index"] + op["reduce"]
                    v = evaluate(lib, chain, env, op["body"], dims)
                    axes = tuple(range(len(op["index"]), len(dims)))
                    return v.sum(dim=axes) if lib == "torch" else v.sum(axis=axes)
        elif op["kind"] == "softmax":
            def step(env, op=op):
                v = evaluate(lib, chain, env, op["body"], op["index"])
                axis = op["index"].index(op["axis"])
                if op["causal"]:
                    dropped = causal_dropped(lib, chain, op, op["index"])
                    v = v.masked_fill(dropped, -math.inf) if lib == "torch" else np.where(dropped, -np.inf, v)
                if lib == "torch":
                    return torch.softmax(v, dim=axis)
                v = np.exp(v - v.max(axis=axis, keepdims=True))
                return v / v.sum(axis=axis, keepdims=True)
        else:
            def step(env, op=op):
                v = evaluate(lib, chain, env, op["body"], op["index"])
                if lib == "torch":
                    return v.expand([chain.extent[d] for d in op["index"]]) if not torch.is_tensor(v) or \
                        list(v.shape) != [chain.extent[d] for d in op["index"]] else v
                return np.broadcast_to(v, [chain.extent[d] for d in op["index"]])
        steps.append((out, step))

    def run(inputs):
        env = dict(zip(chain.inputs, inputs))
        for out, step in steps:
            env[out] = step(env)
        return [env[o] for o in chain.outputs]
    return run


# -------------------------------------------------------------- onnx ---

def onnx_program(chain, dtype, values=None):
    """An onnxruntime session over the chain and a fn(inputs) -> outputs (arrays in the chain's layout). With
    `values` (every input's), the chain's constant inputs are initializers, as a model's weights are: onnxruntime
    may fold and prepack them when it builds the session."""
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    att = attention_pattern(chain)
    nodes, inits = [], []
    counter = [0]

    def fresh(prefix):
        counter[0] += 1
        return "%s_%d" % (prefix, counter[0])

    def const(value, shape=None):
        name = fresh("c")
        arr = np.array(value, dtype=dtype if shape is None else np.int64).reshape(shape if shape else [])
        inits.append(helper.make_tensor(name, elem if shape is None else TensorProto.INT64, arr.shape,
                                        arr.flatten().tolist()))
        return name

    def node(op, inputs, **attrs):
        out = fresh(op)
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    if att is not None:
        # MultiHeadAttention on [batch, sequence, heads * head size]: b folds
        # the heads (batch 1); the layout change is done outside the session.
        heads = math.prod(chain.extent[d] for d in att["batch"])
        m, n, k, h = (chain.extent[att[x]] for x in ("m", "n", "k_dim", "h"))
        graph_in = [helper.make_tensor_value_info("q", elem, [1, m, heads * k]),
                    helper.make_tensor_value_info("k", elem, [1, n, heads * k]),
                    helper.make_tensor_value_info("v", elem, [1, n, heads * h])]
        mha_inputs = ["q", "k", "v"]
        mask = att["mask"]
        # A causal softmax with as many queries as keys: MultiHeadAttention's own (unidirectional); any
        # other offset is part of the bias.
        unidirectional = att["causal"] is not None and att["causal"][1] == 0 and m == n
        causal_bias = att["causal"] is not None and not unidirectional
        # The additive mask as MultiHeadAttention's attention_bias [1, heads or 1, m, n].
        bias_heads = heads if mask is not None and len(mask_dims(att)) > 2 else 1
        if mask is not None or causal_bias:
            graph_in.append(helper.make_tensor_value_info("bias", elem, [1, bias_heads, m, n]))
            mha_inputs += ["", "", "bias"]
        nodes.append(helper.make_node("MultiHeadAttention", mha_inputs, ["o"], domain="com.microsoft",
                                      num_heads=heads, scale=float(att["scale"]), unidirectional=int(unidirectional)))
        graph_out = [helper.make_tensor_value_info("o", elem, [1, m, heads * h])]
        graph = helper.make_graph(nodes, chain.name, graph_in, graph_out)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        session = make_session(model)

        def run_prepared(feeds):
            return session.run(None, feeds)

        def prepare(inputs):
            env = dict(zip(chain.inputs, inputs))

            def heads_last(name, seq, size):
                x = attention_operand("numpy", chain, att, env, name)
                return np.ascontiguousarray(x.reshape(heads, seq, size).transpose(1, 0, 2).reshape(1, seq, heads * size))
            feeds = {"q": heads_last("q", m, k), "k": heads_last("k", n, k), "v": heads_last("v", n, h)}
            if mask is not None or causal_bias:
                bias = np.zeros([1] * len(att["batch"]) + [m, n], dtype=dtype)
                if mask is not None:
                    bias = mask_over_batch(chain, att, np.asarray(array_program("numpy", mask_chain(chain, att))(
                        inputs)[0], dtype=dtype))
                if causal_bias:
                    dropped = causal_dropped("numpy", chain, att["softmax"], att["batch"] + [att["m"], att["n"]])
                    bias = np.where(dropped, np.asarray(-np.inf, dtype=dtype), bias)
                feeds["bias"] = np.ascontiguousarray(np.broadcast_to(bias, [chain.extent[d] for d in att["batch"]] +
                                                                     [m, n]).reshape(1, heads, m, n)[:, :bias_heads])
            return feeds

        def finish(outs):
            shape = [chain.extent[d] for d in att["batch"]] + [m, h]
            return [outs[0].reshape(m, heads, h).transpose(1, 0, 2).reshape(shape).transpose(att["out_perm"])]
        return "MultiHeadAttention (com.microsoft%s)" % (", unidirectional" if unidirectional else ""), prepare, \
            run_prepared, finish

    # Op by op: MatMul where the sum is a batched matrix product, Conv for
    # convolutions, Einsum otherwise; elementwise nodes and Softmax.
    constants = chain.constants if values is not None else set()
    graph_in = [helper.make_tensor_value_info(t, elem, chain.shape[t]) for t in chain.inputs if t not in constants]
    for t, v in zip(chain.inputs, values or []):
        if t in constants:
            inits.append(helper.make_tensor(t, elem, chain.shape[t], np.ascontiguousarray(v, dtype=dtype).tobytes(),
                                            raw=True))
    value = {t: t for t in chain.inputs}

    def align(access, dims):
        """The access as a tensor broadcastable over `dims` (Transpose + Reshape)."""
        name = value[access.tensor]
        if not all(e.plain() for e in access.index) or len({e.dim() for e in access.index}) != len(access.index):
            raise NotImplementedError("affine access outside a convolution")
        used = [e.dim() for e in access.index]
        order = sorted(range(len(used)), key=lambda i: dims.index(used[i]))
        if order != list(range(len(used))):
            name = node("Transpose", [name], perm=order)
        shape = [chain.extent[d] if d in used else 1 for d in dims]
        if shape != [chain.extent[d] for d in sorted(used, key=dims.index)]:
            name = node("Reshape", [name, const(shape, [len(shape)])])
        return name

    def expr(e, dims):
        if e.kind == "const":
            return const(e.value)
        if e.kind == "access":
            return align(e, dims)
        if e.kind == "neg":
            return node("Neg", [expr(e.args[0], dims)])
        if e.kind == "call":
            x = expr(e.args[0], dims)
            if e.func == "gelu":
                return node("Gelu", [x], domain="com.microsoft")
            if e.func == "gelu_tanh":
                return node("FastGelu", [x], domain="com.microsoft")
            return node({"relu": "Relu", "exp": "Exp", "tanh": "Tanh", "sigmoid": "Sigmoid"}[e.func], [x])
        a, b = expr(e.args[0], dims), expr(e.args[1], dims)
        return node({"+": "Add", "-": "Sub", "*": "Mul", "/": "Div"}[e.kind], [a, b])

    letter = {d: LETTERS[i] for i, d in enumerate(chain.extent)}
    used_ops = set()
    for op in chain.ops:
        index = op["index"]
        if op["kind"] == "sum":
            conv = conv_pattern(chain, op)
            f = factors(op["body"])
            if conv is not None:
                (p, sp, dp, a), (q, sq, dq, b) = conv["spatial"]
                x = value[conv["x"]]
                if a or b:
                    shape = chain.shape[conv["x"]]
                    x = node("Slice", [x, const([a, b], [2]), const([shape[2], shape[3]], [2]), const([2, 3], [2])])
                w = value[conv["w"]]
                if conv.get("pointwise"):
                    w = node("Reshape", [w, const(chain.shape[conv["w"]] + [1, 1], [4])])
                y = node("Conv", [x, w], strides=[sp, sq], dilations=[dp, dq])
                used_ops.add("Conv")
                # Cut to the chain's extents where the input holds more rows than they read.
                shape = chain.shape[conv["x"]]
                kernel = [1, 1] if conv.get("pointwise") else chain.shape[conv["w"]][2:]
                natural = [(shape[2 + i] - off - dil * (kernel[i] - 1) - 1) // st + 1
                           for i, (st, dil, off) in enumerate(((sp, dp, a), (sq, dq, b)))]
                if natural != [chain.extent[p], chain.extent[q]]:
                    y = node("Slice", [y, const([0, 0], [2]), const([chain.extent[p], chain.extent[q]], [2]),
                                       const([2, 3], [2])])
                if conv["scale"] != 1:
                    y = node("Mul", [y, const(conv["scale"])])
                perm = [conv["order"].index(d) for d in index]
                if perm != list(range(4)):
                    y = node("Transpose", [y], perm=perm)
            elif f is not None and all(all(e.plain() for e in a.index) for a in f[1]) and len(f[1]) == 2:
                a_acc, b_acc = f[1]
                y = matmul_nodes(chain, op, a_acc, b_acc, value, node, const)
                if y is None:
                    spec = ",".join("".join(letter[e.dim()] for e in acc.index) for acc in f[1]) + "->" + \
                        "".join(letter[d] for d in index)
                    y = node("Einsum", [value[acc.tensor] for acc in f[1]], equation=spec)
                    used_ops.add("Einsum")
                else:
                    used_ops.add("MatMul")
                if f[0] != 1:
                    y = node("Mul", [y, const(f[0])])
            else:
                raise NotImplementedError("a sum that is not a product of plain accesses")
        elif op["kind"] == "softmax":
            y = expr(op["body"], index)
            if op["causal"]:
                dropped = causal_dropped("numpy", chain, op, index)
                minus = np.where(dropped, np.asarray(-np.inf, dtype=dtype), np.asarray(0, dtype=dtype))
                name = fresh("causal")
                inits.append(helper.make_tensor(name, elem, minus.shape, minus.flatten().tolist()))
                y = node("Add", [y, name])
            axis = index.index(op["axis"])
            y = node("Softmax", [y], axis=axis)
            used_ops.add("Softmax")
        else:
            y = expr(op["body"], index)
            used_ops.update(n.op_type for n in nodes if n.op_type in ("Gelu", "Relu", "Add", "Tanh", "Sigmoid"))
        value[op["output"]] = y
    outs = []
    for t in chain.outputs:
        # The node that computes an output writes it (an Identity only where
        # the value is an input or feeds other nodes too).
        maker = [nd for nd in nodes if value[t] in nd.output]
        shared = sum(value[u] == value[t] for u in chain.outputs) > 1
        if maker and not shared and not any(value[t] in nd.input for nd in nodes):
            maker[0].output[list(maker[0].output).index(value[t])] = t + "_out"
        else:
            nodes.append(helper.make_node("Identity", [value[t]], [t + "_out"]))
        outs.append(helper.make_tensor_value_info(t + "_out", elem, chain.shape[t]))
    graph = helper.make_graph(nodes, chain.name, graph_in, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    session = make_session(model)
    label = ", ".join(sorted(used_ops)) or "elementwise"
    if constants:
        label += " (constants as initializers)"
    return label, (lambda inputs: {t: np.ascontiguousarray(x) for t, x in zip(chain.inputs, inputs)
                                   if t not in constants}), \
        (lambda feeds: session.run(None, feeds)), (lambda outs: outs)


def matmul_nodes(chain, op, a, b, value, node, const):
    """MatMul for A[batch..., i, k] x B[batch..., k, j] up to transposes; None when the sum is no such product."""
    index, red = op["index"], op["reduce"]
    if len(red) != 1:
        return None
    k = red[0]
    da, db = [e.dim() for e in a.index], [e.dim() for e in b.index]
    if k not in da or k not in db:
        return None
    batch = [d for d in index if d in da and d in db]
    ia = [d for d in da if d not in batch and d != k]
    ib = [d for d in db if d not in batch and d != k]
    if len(ia) != 1 or len(ib) != 1 or sorted(da) != sorted(batch + ia + [k]) or sorted(db) != sorted(batch + ib + [k]):
        return None
    i, j = ia[0], ib[0]
    if index[:len(batch)] != batch or sorted(index) != sorted(batch + [i, j]):
        return None

    def arranged(acc, dims, want):
        name = value[acc.tensor]
        if dims != want:
            name = node("Transpose", [name], perm=[dims.index(d) for d in want])
        return name
    y = node("MatMul", [arranged(a, da, batch + [i, k]), arranged(b, db, batch + [k, j])])
    if index != batch + [i, j]:
        y = node("Transpose", [y], perm=[(batch + [i, j]).index(d) for d in index])
    return y


def mask_dims(att):
    """The dims the attention's additive mask varies along: the batch dims it reads, then m and n."""
    used = set()

    def visit(e):
        if e.kind == "access":
            for x in e.index:
                used.update(x.terms)
        for a in getattr(e, "args", []):
            visit(a)
    visit(att["mask"])
    return [d for d in att["batch"] if d in used] + [att["m"], att["n"]]


def mask_chain(chain, att):
    """A chain computing only the attention's additive mask, over mask_dims(att)."""
    class MaskChain:
        pass
    mc = MaskChain()
    mc.name, mc.extent, mc.inputs = chain.name, chain.extent, chain.inputs
    mc.outputs = ["__mask"]
    dims = mask_dims(att)
    mc.ops = [dict(kind="map", output="__mask", index=dims, reduce=[], axis=None, body=att["mask"])]
    mc.shape = dict(chain.shape)
    mc.shape["__mask"] = [chain.extent[d] for d in dims]
    return mc


def mask_over_batch(chain, att, mask):
    """The mask from mask_chain, broadcastable over batch + [m, n] (size 1 along batch dims it does not read)."""
    used = mask_dims(att)
    return mask.reshape([chain.extent[d] if d in used else 1 for d in att["batch"]] +
                        [chain.extent[att["m"]], chain.extent[att["n"]]])


def make_session(model):
    options = ort.SessionOptions()
    options.intra_op_num_threads = ARGS.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


# ------------------------------------------------------------- fusor ---

def fusor_base():
    cmd = [ARGS.fusor]
    if ARGS.server:
        cmd += ["--server", ARGS.server]
    elif ARGS.db:
        cmd += ["--db", ARGS.db]
    return cmd


def build_kernel(out):
    return fusor_kernel_lib.build_kernel(out, ARGS.compiler)


def fusor_kernel(path, work):
    """Compiles fusor's best kernel for the chain; returns (entry point, metadata)."""
    out = os.path.join(work, "kernel")
    if ARGS.model_only:
        cmd = [ARGS.fusor, "compile", "--model-only", "--target", "local", path, "-o", out]
        if ARGS.schedule:
            cmd += ["--schedule", ARGS.schedule]
    else:
        cmd = fusor_base() + ["compile", path, "-o", out] + (["--budget", str(ARGS.budget)] if ARGS.budget else [])
    run_cmd(cmd)
    return build_kernel(out)


def fusor_unfused(path, work, blas):
    """fusor's unfused baseline through `blas`, as its workers build it."""
    out = os.path.join(work, "unfused-" + blas)
    run_cmd([ARGS.fusor, "compile", "--unfused", blas, path, "-o", out])
    return build_kernel(out)


def storage(dtype):
    return {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dtype]


def to_storage(values, dtype):
    if dtype == "bf16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(storage(dtype))


def from_storage(a, dtype):
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(a, dtype=np.float64)


class WrongResult(ValueError):
    """An implementation's output is out of tolerance: the run fails, whichever implementation it is."""


def check(name, outs, refs, tol):
    """Max relative error (fusor's rule); raises WrongResult when any element is out of tolerance or not finite."""
    worst = 0.0
    for out, ref in zip(outs, refs):
        out = np.asarray(out, dtype=np.float64).reshape(ref.shape)
        rms = math.sqrt(float(np.mean(ref * ref))) if ref.size else 0.0
        rel = np.abs(out - ref) / (np.abs(ref) + rms)
        if not np.all(np.isfinite(out)) or not np.all(rel <= tol):
            bad = int(np.argmax(np.where(np.isfinite(rel), rel, np.inf)))
            raise WrongResult("%s: element %d is %r, expected %r (relative error %.3g > %.3g)" % (
                name, bad, out.flat[bad], ref.flat[bad], rel.flat[bad], tol))
        worst = max(worst, float(rel.max()) if rel.size else 0.0)
    return worst


# ------------------------------------------------------------ timing ---

def time_interleaved(impls, seconds, slice_s=0.15, gap_s=0.15):
    """Runs each impl in turn for slices of `slice_s` until each has `seconds` of samples; per-call samples.

    Thread pools spin after their work (OpenMP's, onnxruntime's, OpenBLAS's
    for up to about 0.1 s): each slice starts after `gap_s` of idling, so the
    previous implementation's threads have gone to sleep, and with one
    untimed call that wakes its own pool.
    """
    for _, fn in impls:
        for _ in range(3):
            fn()
    samples = {name: [] for name, _ in impls}
    spent = {name: 0.0 for name, _ in impls}
    deadline = time.perf_counter() + 30 * seconds * len(impls) + 10
    while min(spent.values()) < seconds and time.perf_counter() < deadline:
        for name, fn in impls:
            if spent[name] >= seconds:
                continue
            time.sleep(gap_s)
            fn()
            end = time.perf_counter() + slice_s
            while True:
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                samples[name].append(t1 - t0)
                spent[name] += t1 - t0
                if t1 >= end:
                    break
    out = {}
    for name, s in samples.items():
        s = sorted(s)
        med = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
        p10, p90 = s[int(0.1 * (len(s) - 1))], s[int(0.9 * (len(s) - 1))]
        out[name] = dict(median_s=med, samples=len(s), spread=(p90 - p10) / med if med > 0 else 0.0,
                         min_s=s[0], p10_s=p10, p90_s=p90)
    return out


def bf16_gemm_rate(seconds):
    """PyTorch's bf16 matmul rate (GFLOP/s) at 1024^3, same threads: the roof of a bf16 chain; None without PyTorch."""
    if torch is None:
        return None
    n = 1024
    a, b = torch.rand(n, n).to(torch.bfloat16), torch.rand(n, n).to(torch.bfloat16)
    t = time_interleaved([("bf16", lambda: a @ b)], seconds)["bf16"]["median_s"]
    return 2 * n ** 3 / t / 1e9


def sgemm_rate(seconds):
    """The machine's sgemm rate (GFLOP/s) at 1024^3 through the fastest library at hand, same threads."""
    n = 1024
    best, lib = 0.0, None
    candidates = [("numpy", lambda a, b: a @ b, np.random.rand(n, n).astype(np.float32),
                   np.random.rand(n, n).astype(np.float32))]
    if torch is not None:
        candidates.append(("torch", lambda a, b: a @ b, torch.rand(n, n), torch.rand(n, n)))
    for name, mm, a, b in candidates:
        t = time_interleaved([(name, lambda mm=mm, a=a, b=b: mm(a, b))], seconds)[name]["median_s"]
        rate = 2 * n ** 3 / t / 1e9
        if rate > best:
            best, lib = rate, name
    return best, lib


# -------------------------------------------------------------- main ---

def bench_chain(path, work, seconds):
    ref_dir = os.path.join(work, "reference")
    run_cmd([ARGS.fusor, "reference", path, "--seed", "11", "-o", ref_dir])
    manifest = json.load(open(os.path.join(ref_dir, "manifest.json")))
    chain = Chain(manifest["chain"])
    tol = manifest["tolerance"]
    read = lambda e: np.fromfile(os.path.join(ref_dir, e["file"]), dtype=np.float64).reshape(e["shape"])
    inputs64 = [read(e) for e in manifest["inputs"]]
    refs = [read(e) for e in manifest["outputs"]]
    result = dict(chain=chain.name, file=path, dtype=chain.dtype, gflop=chain.flops() / 1e9, impls={}, notes=[])

    fn, meta = fusor_kernel(path, work)
    kmeta = meta.get("kernel", meta)
    result["fusor"] = dict(schedule=meta.get("schedule") or kmeta.get("schedule"), mapping=meta.get("mapping"),
                           measured_s=meta.get("measured_median_s"), baseline_s=meta.get("baseline_median_s"),
                           baseline_kind=meta.get("baseline_kind"), printed_speedup=meta.get("speedup"))
    f_inputs = [np.ascontiguousarray(to_storage(x, chain.dtype)) for x in inputs64]
    threads = ARGS.threads
    impls = []

    def add_kernel(name, fn, what):
        """A fusor kernel (fused or its own unfused baseline), validated, then timed with the rest."""
        outputs = [np.empty(r.shape, dtype=storage(chain.dtype)) for r in refs]
        for o in outputs:
            o.fill(np.nan) if chain.dtype != "bf16" else o.fill(0x7fc0)
        in_ptrs = (ctypes.c_void_p * len(f_inputs))(*[x.ctypes.data for x in f_inputs])
        out_ptrs = (ctypes.c_void_p * len(outputs))(*[x.ctypes.data for x in outputs])
        state = None
        if hasattr(fn, "prepare"):
            start = time.perf_counter()
            state = fn.prepare(in_ptrs)
            result["fusor"]["prepare_s"] = time.perf_counter() - start
            if not state:
                raise RuntimeError("%s: fusor_prepare ran out of memory" % name)

        def run(keep=(f_inputs, outputs)):  # the buffers live as long as the pointers
            rc = fn(in_ptrs, out_ptrs, threads) if state is None else fn.run_prepared(state, in_ptrs, out_ptrs, threads)
            if rc != 0:
                raise RuntimeError("%s returned an error" % name)
        run()
        result["impls"][name] = dict(max_rel_error=check(name, [from_storage(o, chain.dtype) for o in outputs], refs,
                                                         tol), what=what)
        impls.append((name, run))

    add_kernel("fusor", fn, result["fusor"]["schedule"])
    if hasattr(fn, "prepare"):  # the same kernel packing its constant inputs on every call (fusor_run)
        add_kernel("fusor_packing_per_call", lambda i, o, t: fn(i, o, t), "the same kernel through fusor_run")
    # fusor's own unfused baselines: what its printed speedup is over.
    for blas in ("openblas", "onednn"):
        try:
            bfn, _ = fusor_unfused(path, work, blas)
            add_kernel("fusor_unfused_" + blas, bfn, "fusor's baseline: %s GEMMs + vector passes" % blas)
        except WrongResult:
            raise
        except Exception as e:
            result["impls"]["fusor_unfused_" + blas] = dict(skipped="%s: %s" % (type(e).__name__,
                                                                              str(e).splitlines()[0][:200]))

    # The peers compute in the chain's dtype where they can, else in f32. One
    # that computes in f16 or bf16 (PyTorch, OpenVINO with that hint) may
    # round its intermediates too (PyTorch eager's scores, say), which fusor's
    # tolerance does not allow for: it is checked within 4 times that
    # tolerance, its error printed.
    low_tol = tol * 4
    if chain.dtype != "f32":
        result["notes"].append("PyTorch and OpenVINO compute in %s: checked within %.3g, 4x fusor's tolerance, as "
                               "they may round their intermediates" % (chain.dtype, low_tol))

    def peer(name, what, build, in_chain_dtype=False):
        try:
            run, args, finish = build()
            outs = finish(run(*args))
            err = check(name, [np.asarray(o.float() if torch is not None and torch.is_tensor(o) else o)
                               for o in outs], refs, low_tol if in_chain_dtype and chain.dtype != "f32" else tol)
            result["impls"][name] = dict(max_rel_error=err, what=what() if callable(what) else what)
            impls.append((name, lambda: run(*args)))
        except ImportError as e:
            result["impls"][name] = dict(skipped=str(e))
        except WrongResult:
            raise
        except Exception as e:  # a peer that cannot run this chain says why; fusor's row stands
            # (OpenVINO's first line names its own source file: the reason is on the lines after it)
            reason = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
            result["impls"][name] = dict(skipped="%s: %s" % (type(e).__name__, reason[:600]))

    peer_dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}[chain.dtype]
    np_inputs = [np.ascontiguousarray(x.astype(peer_dtype)) for x in inputs64]

    def torch_build(sdpa=False, tdtype=None):
        if torch is None:
            raise ImportError("not installed")
        tdtype = tdtype or {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[chain.dtype]
        t_inputs = [torch.from_numpy(x.astype(np.float32)).to(tdtype).contiguous() for x in inputs64]
        if not sdpa:
            prog = array_program("torch", chain)
            return (lambda xs: prog(xs)), (t_inputs,), (lambda outs: [o.float().numpy() for o in outs])
        att = attention_pattern(chain)
        if att is None:
            raise ValueError("not an attention chain")
        env = dict(zip(chain.inputs, t_inputs))
        # Views in SDPA's [batch..., seq, size] order: strided as the chain's tensors are.
        q, k, v = (attention_operand("torch", chain, att, env, x) for x in ("q", "k", "v"))
        mask = None
        if att["mask"] is not None:
            mask = array_program("torch", mask_chain(chain, att))(t_inputs)[0].to(tdtype).contiguous()
            mask = mask_over_batch(chain, att, mask)
        # A causal softmax: SDPA's is_causal (queries aligned with the first keys, offset 0), or with a mask
        # or another offset, the two in one additive mask, as transformers builds it.
        is_causal = att["causal"] is not None and att["causal"][1] == 0 and mask is None
        if att["causal"] is not None and not is_causal:
            dropped = causal_dropped("torch", chain, att["softmax"], att["batch"] + [att["m"], att["n"]])
            mask = (torch.zeros((), dtype=tdtype) if mask is None else mask).masked_fill(dropped, -math.inf)
            mask = mask.contiguous()

        def run(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                  scale=att["scale"]).permute(att["out_perm"])
        return run, (q, k, v, mask), (lambda o: [o.float().numpy()])

    f32_inputs = [np.ascontiguousarray(x.astype(np.float32)) for x in inputs64]

    def numpy_build():
        prog = array_program("numpy", chain)
        return (lambda xs: prog(xs)), (f32_inputs,), (lambda outs: outs)

    def openvino_build(sdpa):
        """OpenVINO native: the PyTorch program in f32 through openvino.convert_model, compiled for the CPU with
        the chain's precision as the hint (a model's weights are f32 and the hint picks the execution
        precision, as users deploy it)."""
        if ov is None:
            raise ImportError("not installed")
        if torch is None:
            raise ImportError("converts the PyTorch program: needs PyTorch (peers.sh --torch)")
        run, args, _ = torch_build(sdpa, torch.float32)
        # The chain's constant inputs are the model's weights: constants of the converted model.
        everything = list(args) if sdpa else list(args[0])
        const_at = {} if sdpa else {i: t for i, (name, t) in enumerate(zip(chain.inputs, everything))
                                    if name in chain.constants}
        tensors = [t for i, t in enumerate(everything) if t is not None and i not in const_at]

        class Program(torch.nn.Module):
            def forward(self, *xs):
                if not sdpa:
                    free = iter(xs)
                    return tuple(run([const_at[i] if i in const_at else next(free) for i in range(len(everything))]))
                q, k, v = xs[:3]
                return run(q, k, v, xs[3] if len(xs) > 3 else None)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on a program it traces as written
            model = ov.convert_model(Program(), example_input=tuple(tensors))
        hint = chain.dtype  # "f32", "f16" or "bf16": OpenVINO's names too
        compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint,
                                                          "INFERENCE_NUM_THREADS": str(threads),
                                                          "PERFORMANCE_HINT": "LATENCY"})
        # The precision the runtime graph runs its matrix products in (the hint is a request).
        executed = set()
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            # (a fused attention is a "Subgraph", or "ScaledAttn")
            if info["layerType"].astype(str) in ("MatMul", "FullyConnected", "ScaledAttn", "Subgraph",
                                                  "Convolution"):
                precision = info["runtimePrecision"].astype(str)
                if precision in ("f32", "bf16", "f16"):  # (a mask's subgraph runs in u8)
                    executed.add(precision)
        peer_what["openvino_sdpa" if sdpa else "openvino"] = "hint %s, ran %s%s" % (
            hint, "/".join(sorted(executed)) or "?", ", ScaledDotProductAttention" if sdpa else "")
        request = compiled.create_infer_request()
        feeds = [np.ascontiguousarray(t.numpy()) for t in tensors]

        def infer(feeds):
            request.infer(feeds, share_inputs=True)
            return [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]
        return infer, (feeds,), (lambda outs: outs)

    def ort_build():
        if ort is None:
            raise ImportError("not installed")
        label, prepare, run, finish = onnx_program(chain, peer_dtype, np_inputs)
        peer_what["ort"] = label
        feeds = prepare(np_inputs)
        return run, (feeds,), finish

    peer_what = {}
    # Every association order a user could write (the chain as written and
    # its regroupings), each a peer of its own.
    orders = [("", manifest["chain"])] + [(r["text"], r["chain"]) for r in manifest.get("regroupings", [])]
    outer_chain = chain
    for text, chain_json in orders:
        chain = Chain(chain_json)
        suffix = ", " + text if text else ""
        key = "" if not text else "_" + re.sub(r"\W", "", text)
        peer("pytorch" + key, "eager" + (" (%s)" % chain.dtype if chain.dtype != "f32" else "") + suffix,
             lambda: torch_build(False), in_chain_dtype=True)
        if attention_pattern(chain) is not None:
            peer("pytorch_sdpa", "scaled_dot_product_attention", lambda: torch_build(True), in_chain_dtype=True)
        if not key:  # OpenVINO compiles the program whole: one peer, whatever the association order
            peer("openvino", lambda: peer_what.get("openvino", ""), lambda: openvino_build(False), in_chain_dtype=True)
            if attention_pattern(chain) is not None:
                peer("openvino_sdpa", lambda: peer_what.get("openvino_sdpa", ""), lambda: openvino_build(True),
                     in_chain_dtype=True)
        peer("onnxruntime" + key, lambda: peer_what.get("ort", "") + suffix, ort_build)
        peer("numpy" + key, "numpy (float32)" + suffix, numpy_build)
    chain = outer_chain
    if chain.dtype == "bf16":
        result["notes"].append("onnxruntime and numpy compute bf16 chains in f32")
    if chain.dtype != "f32":
        result["notes"].append("numpy computes in f32 (it has no BLAS for f16 or bf16)")

    timings = time_interleaved(impls, seconds)
    for name, t in timings.items():
        result["impls"][name].update(t)
    fusor_t = result["impls"]["fusor"]["median_s"]
    peers = [(n, d["median_s"]) for n, d in result["impls"].items() if not n.startswith("fusor") and "median_s" in d]
    if peers:
        fastest = min(peers, key=lambda p: p[1])
        result["fastest_peer"] = fastest[0]
        result["speedup_vs_fastest_peer"] = fastest[1] / fusor_t
    # The speedup fusor printed (over its baseline, in the tuning task)
    # against the one measured here over the same baseline.
    kind = result["fusor"].get("baseline_kind")
    base = result["impls"].get("fusor_unfused_" + kind, {}) if kind else {}
    if "median_s" in base:
        result["speedup_over_baseline_here"] = base["median_s"] / fusor_t
    result["fusor_gflops"] = chain.flops() / result["impls"]["fusor"]["median_s"] / 1e9
    return result


def fmt_time(s):
    return "%.3f ms" % (s * 1e3) if s >= 1e-4 else "%.1f us" % (s * 1e6)


def main():
    if ort is None:
        print("peers: onnxruntime is not installed (pip install onnx onnxruntime)", file=sys.stderr)
    seconds = 0.05 if ARGS.short else ARGS.seconds
    work_root = ARGS.keep or tempfile.mkdtemp(prefix="fusor-peers-")
    report = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), machine=cpu_name(), cores=os.cpu_count(),
                  threads=ARGS.threads, short=ARGS.short, seconds=seconds,
                  versions=dict(numpy=np.__version__, torch=torch.__version__ if torch else None,
                                onnxruntime=ort.__version__ if ort else None,
                                openvino=ov.get_version() if ov else None, python=platform.python_version()),
                  command=" ".join(shlex.quote(a) for a in sys.argv), chains=[])
    report["sgemm_gflops"], report["sgemm_lib"] = sgemm_rate(seconds)
    report["bf16_gemm_gflops"] = bf16_gemm_rate(seconds)
    failed = False
    for i, path in enumerate(ARGS.chains):
        work = os.path.join(work_root, "%d" % i)
        os.makedirs(work, exist_ok=True)
        try:
            r = bench_chain(path, work, seconds)
        except Exception as e:
            print("peers: %s: %s" % (path, e), file=sys.stderr)
            report["chains"].append(dict(file=path, error=str(e)))
            failed = True
            continue
        report["chains"].append(r)
        print_chain(r, report["sgemm_gflops"], report["bf16_gemm_gflops"])
    if ARGS.short:
        print("short mode: every implementation validated; the times above are not a measurement")
    else:
        print("sgemm %.0f GFLOP/s (%s, %d threads, 1024^3) on %s" % (report["sgemm_gflops"], report["sgemm_lib"],
                                                                      ARGS.threads, report["machine"]))
        if report["bf16_gemm_gflops"]:
            print("bf16 matmul %.0f GFLOP/s (torch, %d threads, 1024^3)" % (report["bf16_gemm_gflops"], ARGS.threads))
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if failed else 0


def print_chain(r, sgemm, bf16_gemm=None):
    print("\n%s (%s, %.3f GFLOP)  fusor schedule: %s" % (r["chain"], r["dtype"], r["gflop"], r["fusor"]["schedule"]))
    print("| implementation | median | spread (p90-p10) | fusor speedup | max rel. error |")
    print("|---|---:|---:|---:|---:|")
    fusor_t = r["impls"]["fusor"]["median_s"]
    for name, d in r["impls"].items():
        label = name + (" — " + d["what"] if d.get("what") else "")
        if "median_s" not in d:
            print("| %s | %s | | | |" % (name, d.get("skipped", "not run")))
            continue
        print("| %s | %s | %.0f%% | %s | %.1e |" % (label, fmt_time(d["median_s"]), 100 * d["spread"],
                                                     "—" if name == "fusor" else "%.2fx" % (d["median_s"] / fusor_t),
                                                     d["max_rel_error"]))
    if "fastest_peer" in r:
        bf16 = r["dtype"] == "bf16" and bf16_gemm
        roof, roof_name = (bf16_gemm, "the bf16 matmul") if bf16 else (sgemm, "sgemm")
        print("fusor vs fastest peer (%s): %.2fx; fusor at %.0f GFLOP/s of the chain as written = %.0f%% of %s" % (
            r["fastest_peer"], r["speedup_vs_fastest_peer"], r["fusor_gflops"], 100 * r["fusor_gflops"] / roof,
            roof_name))
    if "speedup_over_baseline_here" in r:
        printed = r["fusor"].get("printed_speedup") or 0
        print("fusor vs its %s baseline here: %.2fx%s" % (
            r["fusor"]["baseline_kind"], r["speedup_over_baseline_here"],
            "; printed when tuned: %.2fx" % printed if printed else ""))
    if "prepare_s" in r["fusor"]:
        print("fusor packed its constant inputs once, in %s (not in its time; onnxruntime's initializers and "
              "PyTorch's weight layouts were prepared once too)" % fmt_time(r["fusor"]["prepare_s"]))
    for note in r["notes"]:
        print("note: " + note)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
