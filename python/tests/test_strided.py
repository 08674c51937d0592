"""Chains written for strided views read in place (fusor._strided: no tensor library needed)."""

import pytest

from fusor._strided import Unsupported, View, attention, ffn, strided_access


def heads(batch, seq, heads_, dim, row=None):
    """The [B, H, S, D] view of a [B, S, row] projection split into heads (row = H·D unless packed)."""
    row = row or heads_ * dim
    return View((batch, heads_, seq, dim), (seq * row, dim, row, 1))


def test_a_head_split_is_read_as_the_projection_lies():
    access = strided_access((2, 12, 128, 64), (128 * 768, 64, 768, 1), "bhmd")
    assert access.extents == (2, 128, 12, 64) and access.index == ("b", "m", "h", "d")
    assert access.declaration("Q") == "Q[2,128,12,64]" and access.access("Q") == "Q[b,m,h,d]"


def test_a_slice_of_a_packed_projection_keeps_the_gap_as_unused_extent():
    # GPT-2: q, k and v are thirds of one [B, S, 3·768] projection; k starts 768 elements in.
    access = strided_access((2, 12, 64, 128), (128 * 2304, 64, 1, 2304), "bhdn")
    assert access.extents == (2, 128, 36, 64) and access.index == ("b", "n", "h", "d")


def test_transposed_weights_broadcast_and_strided_dims():
    assert strided_access((768, 3072), (1, 768), "cf").index == ("f", "c")  # nn.Linear's [out, in], read as [in, out]
    mask = strided_access((2, 12, 128, 128), (128, 0, 0, 1), "bhmn")  # a padding mask broadcast over heads and rows
    assert mask.extents == (2, 128) and mask.index == ("b", "n")
    assert strided_access((3, 4), (2, 6), "ab").index == ("b", "a*2")  # every other element


def test_views_with_no_affine_buffer_are_refused():
    assert strided_access((4, 4), (4, 4), "ab") is None  # overlapping
    assert strided_access((4, 4), (-1, 4), "ab") is None  # negative
    assert strided_access((2, 3, 5), (1, 2, 7), "abc") is None  # 7 is no multiple of 2
    with pytest.raises(ValueError):
        strided_access((2,), (1, 1), "ab")


def test_attention_in_the_models_layouts():
    q = heads(2, 16, 4, 16)
    mask = View((2, 4, 16, 16), (16, 0, 0, 1))
    text = attention(q, q, q, mask, 0.25, "f32", (0, 2, 1, 3))
    # Each buffer axis that is exactly a dim is declared with it: its size follows the dim's.
    assert "in  Q[z0,m,z1,d] K[z0,n,z1,d] V[z0,n,z1,e] M[z0,n]" in text
    assert "S[z0,z1,m,n] = sum(d) Q[z0,m,z1,d] * K[z0,n,z1,d] * 0.25" in text
    assert "P[z0,z1,m,n] = softmax(n) S[z0,z1,m,n] + M[z0,n]" in text
    # The output is written with the heads merged back, as the model's next projection reads it.
    assert "O[z0,m,z1,e] = sum(n) P[z0,z1,m,n] * V[z0,n,z1,e]" in text


def test_grouped_query_attention_reads_each_key_head_for_its_group():
    q = heads(2, 8, 6, 16)
    k = heads(2, 8, 2, 16)
    text = attention(q, k, k, None, 0.25, "bf16", (0, 1, 2, 3), gqa=True)
    assert "dim z0=2 z1=2 r=3 m=8 n=8 d=16 e=16" in text
    assert "Q[z0,m,z1,r,d] * K[z0,n,z1,d]" in text
    assert "O[z0,z1,r,m,e]" in text
    with pytest.raises(Unsupported, match="do not group"):
        attention(q, heads(2, 8, 4, 16), heads(2, 8, 4, 16), None, 1.0, "f32", (0, 1, 2, 3), gqa=True)


def test_causal_attention_is_the_softmax_s_condition():
    q = heads(2, 16, 4, 16)
    assert "P[z0,z1,m,n] = softmax(n <= m) S[z0,z1,m,n]\n" in attention(q, q, q, None, 0.25, "f32", (0, 1, 2, 3),
                                                                       causal=0)
    mask = View((2, 4, 16, 16), (16, 0, 0, 1))
    assert "softmax(n <= m + 3) S[z0,z1,m,n] + M[z0,n]" in attention(q, q, q, mask, 0.25, "f32", (0, 1, 2, 3),
                                                                      causal=3)


def test_attention_refuses_what_does_not_chain():
    q = heads(2, 16, 4, 16)
    with pytest.raises(Unsupported, match="do not chain"):
        attention(q, heads(2, 16, 4, 8), q, None, 1.0, "f32", (0, 1, 2, 3))
    with pytest.raises(Unsupported, match="does not broadcast"):
        attention(q, heads(3, 16, 4, 16), q, None, 1.0, "f32", (0, 1, 2, 3))
    with pytest.raises(Unsupported, match="not a permutation"):
        attention(q, q, q, None, 1.0, "f32", (0, 1, 1, 3))
    with pytest.raises(Unsupported, match="no affine layout"):
        attention(View((2, 4, 16, 16), (64, 16, 4, 4)), q, q, None, 1.0, "f32", (0, 1, 2, 3))


def test_ffn_reads_linear_weights_as_stored():
    x = View((2, 16, 64), (1024, 64, 1))
    w1, w2 = View((64, 128), (1, 64)), View((128, 64), (1, 128))  # weight.t() of [128, 64] and [64, 128]
    text = ffn(x, w1, w2, "f32", "gelu", b1=True, b2=True)
    assert "dim m=32 c=64 f=128 o=64" in text
    assert "in  X[m,c] W1[f,c] B1[128] W2[o,f] B2[64]" in text
    assert "H[m,f] = sum(c) X[m,c] * W1[f,c]" in text and "G[m,f] = gelu(H[m,f] + B1[f])" in text
    assert "Z[m,o] = Y[m,o] + B2[o]" in text and text.rstrip().endswith("out Z")


def test_gated_ffn_and_unmergeable_rows():
    x = View((32, 64), (64, 1))
    w = View((64, 128), (1, 64))
    text = ffn(x, w, View((128, 64), (1, 128)), "f32", "silu", up=w)
    assert "U[m,f] = sum(c) X[m,c] * WU[f,c]" in text
    assert "G[m,f] = (H[m,f] * sigmoid(H[m,f])) * U[m,f]" in text
    with pytest.raises(Unsupported, match="do not merge"):
        ffn(View((2, 16, 64), (2048, 64, 1)), w, View((128, 64), (1, 128)), "f32", None)
    with pytest.raises(Unsupported, match="activation 'swish'"):
        ffn(x, w, View((128, 64), (1, 128)), "f32", "swish")
