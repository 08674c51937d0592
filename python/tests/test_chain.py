"""Chains from text, files and the builder (no scheduler needed)."""


import pytest

import fusor
from fusor import Chain, ChainBuilder, ChainError
from fusor._chain import as_chain, render_text
from fusor.v1 import workload_pb2

from conftest import ATTENTION, REPO

EXAMPLES = sorted((REPO / "examples").glob("*.fusor")) + sorted((REPO / "examples" / "operators").glob("*.fusor"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_reads_and_renders_back_to_the_same_chain(path):
    chain = Chain.from_file(path)
    assert chain.text == path.read_text()
    again = Chain.parse(render_text(chain.structured()))
    assert again.structured() == chain.structured()
    assert chain.structured().ops, path


def test_text_is_read_into_the_structured_chain():
    c = Chain.parse(ATTENTION).structured()
    assert c.name == "small_attention" and c.dtype == workload_pb2.DTYPE_F32
    assert [(d.name, d.extent) for d in c.dims] == [("b", 2), ("m", 32), ("n", 48), ("k", 16), ("h", 24)]
    assert [(t.name, list(t.shape)) for t in c.inputs] == [("Q", ["b", "m", "k"]), ("K", ["b", "n", "k"]),
                                                           ("V", ["b", "n", "h"])]
    s, p, o = c.ops
    assert (s.output, list(s.index), s.kind, list(s.reduce), s.expr) == (
        "S", ["b", "m", "n"], workload_pb2.OP_KIND_SUM, ["k"], "Q[b,m,k] * K[b,n,k] * 0.25")
    assert (p.kind, p.axis, p.expr) == (workload_pb2.OP_KIND_SOFTMAX, "n", "S[b,m,n]")
    assert list(c.outputs) == ["O"]


def test_the_builder_makes_the_chain_the_text_describes():
    built = (ChainBuilder("small_attention")
             .dim(b=2, m=32, n=48, k=16, h=24)
             .input("Q", "b", "m", "k").input("K", "b", "n", "k").input("V", "b", "n", "h")
             .sum("S[b,m,n]", "k", "Q[b,m,k] * K[b,n,k] * 0.25")
             .softmax("P[b,m,n]", "n", "S[b,m,n]")
             .sum("O[b,m,h]", ["n"], "P[b,m,n] * V[b,n,h]")
             .output("O")
             .build())
    assert built.structured() == Chain.parse(ATTENTION).structured()
    assert built.workload.HasField("chain")
    assert "O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]" in built.text


def test_tabs_separate_like_spaces():
    c = Chain.parse("chain\tt\ndtype\tf32\ndim\tm=4\tn=8\nin\tX[m,n]\nY[m,n] =\trelu(X[m,n])\nout\tY\n")
    assert c.name == "t" and [d.name for d in c.structured().dims] == ["m", "n"]
    assert c.structured().ops[0].expr == "relu(X[m,n])"


def test_a_map_op_and_a_literal_shape():
    c = (ChainBuilder("m", dtype="f16").dim(m=4, n=8).input("X", "m", "n").input("B", 8)
         .map("Y[m,n]", "relu(X[m,n] + B[n])").output("Y").build())
    op = c.structured().ops[0]
    assert op.kind == workload_pb2.OP_KIND_MAP and op.expr == "relu(X[m,n] + B[n])"
    assert list(c.structured().inputs[1].shape) == ["8"] and c.dtype == "f16"


@pytest.mark.parametrize("text, message", [
    ("chain c\ndtype f64\n", "line 2: dtype 'f64'"),
    ("chain c\ndim m=x\n", "line 2: extent of 'm' is 'x'"),
    ("chain c\ndim m\n", "line 2: expected NAME=EXTENT"),
    ("chain c\nin X\n", "line 2: expected NAME[dims]"),
    ("chain c\nY[m] + X[m]\n", "line 2: expected a statement"),
    ("chain c\nY[m] = softmax(m,n) X[m,n]\n", "line 2: softmax takes exactly one axis"),
    ("chain c\nY[m] =\n", "line 2: expected an expression"),
])
def test_malformed_text_says_which_line(text, message):
    chain = Chain.parse(text)  # sent as written: the scheduler says what is wrong
    with pytest.raises(ChainError, match=message.replace("[", r"\[")):
        chain.structured()  # where a structured chain is needed (a sweep), it is read here


def test_files_paths_and_json(tmp_path):
    path = REPO / "examples" / "gemm_chain.json"
    by_str, by_path = as_chain(str(path)), as_chain(path)
    assert by_str.name == by_path.name == "gemm_chain_json"
    assert by_str.workload.HasField("chain")
    assert [o.output for o in by_path.structured().ops] == ["C", "E"]
    with pytest.raises(ChainError, match="neither chain text nor a chain file"):
        as_chain("no/such/file.fusor")
    with pytest.raises(ChainError, match="cannot read chain file"):
        Chain.from_file(tmp_path / "missing.fusor")
    bad = tmp_path / "bad.json"
    bad.write_text('{"chain": {"name": 3, "nonsense": true}}')
    with pytest.raises(ChainError, match="not a valid fusor.v1.Workload or Chain"):
        Chain.from_file(bad)
    with pytest.raises(ChainError, match="not int"):
        as_chain(3)


def test_the_builder_refuses_what_it_cannot_write():
    with pytest.raises(ChainError, match="dtype 'f64'"):
        ChainBuilder("c", dtype="f64")
    with pytest.raises(ChainError, match="NAME\\[dims\\]"):
        ChainBuilder("c").map("Y", "X[m]")
    with pytest.raises(ChainError, match="no outputs"):
        ChainBuilder("c").dim(m=2).input("X", "m").map("Y[m]", "X[m]").build()
    assert isinstance(as_chain(ChainBuilder("c").dim(m=2).input("X", "m").map("Y[m]", "X[m]").output("Y")),
                      fusor.Chain)
