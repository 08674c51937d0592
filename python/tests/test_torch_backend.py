"""torch.compile(model, backend="fusor") and fusor.torch.optimize on small models (skipped without PyTorch).

Every test checks the compiled model's outputs against eager's; chains are tuned by the session's real
scheduler and worker with a budget of 2 candidates.
"""

import logging
import math
import time

import pytest

torch = pytest.importorskip("torch")

import fusor.torch as ft  # noqa: E402
from fusor.torch import _runtime  # noqa: E402

nn, F = torch.nn, torch.nn.functional
AHEAD = {"rest": "eager", "tune": "ahead", "budget": 2}


@pytest.fixture(autouse=True)
def backend_uses_the_test_client(client):
    ft.set_client(client)
    torch._dynamo.reset()
    yield
    ft.set_client(None)


class Attention(nn.Module):
    """Self-attention written out as BERT's eager path writes it: head views, q·kᵀ / √d + mask, softmax,
    dropout, ·v, heads merged back."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask):
        b, s, hidden = x.shape
        q, k, v = (p(x).view(b, s, self.heads, self.dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dim) + mask
        out = self.drop(scores.softmax(dim=-1)) @ v
        return self.o(out.transpose(1, 2).contiguous().reshape(b, s, hidden))


class EinsumAttention(nn.Module):
    """Attention as einsum from one packed projection, padding filled in by a boolean masked_fill."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)

    def forward(self, x, padding):
        b, s, hidden = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(b, s, 3, self.heads, self.dim).unbind(2))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.dim ** -0.5
        scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
        return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


class Block(nn.Module):
    def __init__(self, hidden=32, heads=4, ffn=64):
        super().__init__()
        self.attention = Attention(hidden, heads)
        self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

    def forward(self, x, mask):
        x = self.norm1(x + self.attention(x, mask))
        return self.norm2(x + self.down(F.gelu(self.up(x))))


class Decoder(nn.Module):
    """A LLaMA-style layer: causal SDPA with grouped K/V heads, and a SwiGLU feed-forward block."""

    def __init__(self, hidden=32, heads=4, kv_heads=2, ffn=48):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.dim, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate, self.up_proj = nn.Linear(hidden, ffn, bias=False), nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        b, s, hidden = x.shape
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(x).split(self.kv_heads * self.dim, dim=-1)  # slices of one projection
        k, v = (t.view(b, s, self.kv_heads, self.dim).transpose(1, 2) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(out.transpose(1, 2).reshape(b, s, hidden))
        return x + self.down(F.silu(self.gate(x)) * self.up_proj(x))


class Conv1D(nn.Module):
    """GPT-2's projection: addmm with the weight stored [in, out]."""

    def __init__(self, nx, nf):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(nx, nf) * 0.1), nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight).view(shape)


class Gpt2Mlp(nn.Module):
    def __init__(self, hidden=32, ffn=64):
        super().__init__()
        self.fc, self.proj = Conv1D(hidden, ffn), Conv1D(ffn, hidden)

    def forward(self, x):
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.proj(h)


class ConvPair(nn.Module):
    """A ResNet-style pair: a padded 3x3 convolution, ReLU, a 1x1 convolution; and a strided unpadded one."""

    def __init__(self, channels=8, hidden=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(channels, hidden, 3, padding=1), nn.Conv2d(hidden, channels, 1)
        self.c, self.d = nn.Conv2d(channels, hidden, 3, stride=2, bias=False), nn.Conv2d(hidden, channels, 1)

    def forward(self, x):
        y = self.b(F.relu(self.a(x)))
        return self.d(F.gelu(self.c(y)))


def padding_mask(batch, seq, keep):
    mask = torch.zeros(batch, 1, 1, seq)
    mask[-1, ..., keep:] = torch.finfo(torch.float32).min
    return mask


def compiled_and_checked(model, *inputs, options=AHEAD, calls=2):
    """`model` compiled with the backend, checked against eager for `calls` calls (tuned, then compared)."""
    expected = model(*inputs)
    compiled = torch.compile(model, backend="fusor", options=options)
    for _ in range(calls):
        torch.testing.assert_close(compiled(*inputs), expected, rtol=1e-5, atol=1e-5)
    return compiled


def chains(kind):
    return [r for r in ft.report() if r["chain"] == f"fusor_{kind}"]


@torch.inference_mode()
def test_attention_and_ffn_are_found_in_their_layouts_and_match_eager():
    torch.manual_seed(0)
    model = Block().eval()
    x, mask = torch.randn(2, 16, 32), padding_mask(2, 16, 11)
    expected = model(x, mask)
    compiled = torch.compile(model, backend="fusor", options=AHEAD)
    torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5)
    attention = [r for r in chains("attention") if "dim z0=2 z1=4 m=16 n=16 d=8" in r["text"]]
    assert attention, ft.report()
    # q, k and v are read as the projections lie, the padding mask as [batch, key], and the output is written
    # with its heads merged, as the output projection reads it.
    text = attention[0]["text"]
    assert "Q[z0,m,z1,d]" in text and "M[z0,n]" in text and "O[z0,m,z1,e]" in text and "* 0.353553391" in text
    assert any("B1[64]" in r["text"] and "gelu(" in r["text"] for r in chains("ffn"))
    # Tuned ahead: compared with the original ops at the next call, then kept only if it won.
    torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5)
    for r in ft.report():
        assert r["state"] in ("fused", "unfused"), r
        assert r["kernel_us"] > 0 and r["original_us"] > 0 and r["error"] < 1e-4
    # Then the graph settled: with the winning chains fused, or as captured.
    settled = ft.graphs()[-1]
    assert settled["runs"] in ("fused", "captured", "fused, eager", "captured, eager") and settled["regions"] == 2
    assert "captured, eager" not in settled["ms"]  # the rest runs eagerly already: nothing else to try
    torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_graph_whose_fused_chains_do_not_pay_runs_as_captured(monkeypatch):
    from fusor.torch import _dispatch
    torch.manual_seed(10)
    model = Block(hidden=40, heads=5, ffn=56).eval()  # chains no other test meets: decided here
    x, mask = torch.randn(2, 16, 40), padding_mask(2, 16, 11)
    expected = model(x, mask)
    monkeypatch.setattr(_runtime, "_MARGIN", 0.0)  # every kernel wins its own comparison...
    monkeypatch.setattr(_dispatch, "_MARGIN", 1e9)  # ...and the graph with them never does
    decisions = len(ft.graphs())
    # The rest compiled: the graph's own comparison then decides (run as is, a region's own comparison does).
    compiled = torch.compile(model, backend="fusor", options={**AHEAD, "rest": "inductor"})
    for _ in range(3):
        torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5)
    settled = ft.graphs()[decisions:]
    assert len(settled) == 1 and settled[0]["runs"] == "captured" and settled[0]["regions"] == 2, settled


def test_parameters_are_packed_once_and_again_when_they_change(monkeypatch):
    """An FFN's weights are the chain's constants: packed once per kernel, and again after an in-place change."""
    from fusor.torch import _dispatch
    torch.manual_seed(12)
    model = Gpt2Mlp(hidden=20, ffn=36).eval()  # a chain no other test meets: decided here
    x = torch.randn(3, 8, 20)
    monkeypatch.setattr(_runtime, "_MARGIN", 0.0)  # the kernel answers, however it compares
    monkeypatch.setattr(_dispatch, "_MARGIN", 0.0)
    with torch.inference_mode():
        compiled_and_checked(model, x, calls=4)
    ffn = [r for r in chains("ffn") if "c=20 f=36" in r["text"]]
    assert ffn and "const W1 B1 W2 B2" in ffn[0]["text"] and ffn[0]["state"] == "fused", ft.report()
    # The region called as the graph calls it, on the parameters themselves.
    region = _runtime.region(ffn[0]["regions"][0])
    region._packed.clear()
    args = (x.view(-1, 20), model.fc.weight, model.fc.bias, model.proj.weight, model.proj.bias, None, None)
    for _ in range(2):
        with torch.inference_mode():
            torch.testing.assert_close(region(*args), region.original(*args), rtol=1e-5, atol=1e-5)
    assert len(region._packed) == 1 and next(iter(region._packed.values()))[0].packs
    with torch.no_grad():
        model.fc.weight.mul_(-0.5)  # outside inference mode: its version counter moves
    with torch.inference_mode():
        torch.testing.assert_close(region(*args), region.original(*args), rtol=1e-5, atol=1e-5)
    assert len(region._packed) == 2
    # Parameters that are inference tensors have no version counter: never packed, run packing per call.
    with torch.inference_mode():
        frozen = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in args)
        torch.testing.assert_close(region(*frozen), region.original(*frozen), rtol=1e-5, atol=1e-5)
    assert len(region._packed) == 2


@torch.inference_mode()
def test_einsum_attention_with_a_boolean_masked_fill():
    torch.manual_seed(8)
    padding = torch.zeros(2, 12, dtype=torch.bool)
    padding[1, 9:] = True
    compiled_and_checked(EinsumAttention().eval(), torch.randn(2, 12, 32), padding)
    attention = [r for r in chains("attention") if "m=12" in r["text"] and "Q[z0,m,12,d]" in r["text"]]
    assert attention and "M[z0,n]" in attention[0]["text"], ft.report()  # q, k, v: thirds of one projection


class UnscaledAttention(nn.Module):
    """softmax(q kᵀ) v with no scale at all (T5 folds it into its weights)."""

    def forward(self, q, k, v):
        return torch.matmul(torch.matmul(q, k.transpose(-1, -2)).softmax(-1), v)


@torch.inference_mode()
def test_attention_without_a_scale_is_not_scaled():
    torch.manual_seed(12)
    compiled_and_checked(UnscaledAttention(), *(torch.randn(2, 3, 10, 8) for _ in range(3)))
    attention = [r for r in chains("attention") if "m=10 n=10 d=8" in r["text"]]
    assert attention and "* 1.0" in attention[0]["text"] and attention[0]["error"] < 1e-4, attention


@torch.inference_mode()
def test_a_cache_miss_never_blocks_the_forward_pass():
    torch.manual_seed(1)
    model = Block(hidden=24, heads=3, ffn=40).eval()
    x, mask = torch.randn(2, 12, 24), padding_mask(2, 12, 7)
    expected = model(x, mask)
    compiled = torch.compile(model, backend="fusor", options={"rest": "eager", "budget": 2})
    torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5)
    new = [r for r in ft.report() if "dim m=24 c=24 f=40 o=24" in r["text"]]
    assert new and new[0]["state"] == "tuning"  # the original ops answered while the service tunes
    assert ft.wait(timeout=240)
    torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5)
    assert [r["state"] for r in ft.report() if r["text"] == new[0]["text"]][0] in ("fused", "unfused")


@torch.inference_mode()
def test_causal_grouped_sdpa_with_sliced_kv_and_a_swiglu_ffn():
    torch.manual_seed(2)
    compiled_and_checked(Decoder().eval(), torch.randn(2, 10, 32))
    attention = [r for r in chains("attention") if "r=2" in r["text"] and "m=10" in r["text"]]
    # K and V are slices of one projection, read in place; K heads are read once per query head of the group.
    assert attention and "K[z0,n,4,d]" in attention[0]["text"] and "* K[z0,n,z1,d]" in attention[0]["text"]
    # is_causal: the softmax's condition, no mask read.
    assert "softmax(n <= m) S[" in attention[0]["text"] and "M[" not in attention[0]["text"]
    assert any("sigmoid(H[m,f])) * U[m,f]" in r["text"] for r in chains("ffn"))


@torch.inference_mode()
def test_gpt2_style_projections_and_a_written_out_gelu():
    torch.manual_seed(3)
    compiled_and_checked(Gpt2Mlp().eval(), torch.randn(2, 8, 32))
    ffn = [r for r in chains("ffn") if "dim m=16 c=32 f=64 o=32" in r["text"]]
    assert ffn and "gelu_tanh(" in ffn[0]["text"] and "W1[c,f]" in ffn[0]["text"]  # stored [in, out]


@torch.inference_mode()
def test_convolution_chains_with_padding_stride_and_channels_last_inputs():
    torch.manual_seed(11)
    model = ConvPair().eval()
    x = torch.randn(2, 8, 12, 12)
    expected = model(x)
    compiled = torch.compile(model, backend="fusor", options=AHEAD)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
    texts = [r["text"] for r in chains("conv_chain")]
    # The padded input is the chain's (copied once, zero-padded); the strided one is read at p*2+r.
    assert any("I[n,c,14,14]" in t and "relu(T[n,k,p,q] + B1[k])" in t and "B2[8]" in t for t in texts), texts
    assert any("I[n,c,p*2+r,q*2+s]" in t and "gelu(T[n,k,p,q])" in t for t in texts), texts
    torch._dynamo.reset()
    x = x.to(memory_format=torch.channels_last)
    compiled = torch.compile(model, backend="fusor", options=AHEAD)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_the_rest_of_the_graph_goes_to_inductor_and_optimize_runs_it_eagerly():
    torch.manual_seed(4)
    model = Block().eval()
    x, mask = torch.randn(2, 16, 32), padding_mask(2, 16, 11)
    expected = model(x, mask)
    compiled = torch.compile(model, backend="fusor", options={"tune": "ahead", "budget": 2})
    for _ in range(2):
        torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    optimized = ft.optimize(model, tune="ahead", budget=2)
    for _ in range(2):
        torch.testing.assert_close(optimized(x, mask), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown fusor backend options"):
        ft.optimize(model, speed="max")


def test_under_autograd_the_graph_is_left_as_it_is(caplog):
    torch.manual_seed(5)
    model = Block().eval()
    x, mask = torch.randn(2, 16, 32), padding_mask(2, 16, 11)
    regions = len(_runtime._regions)
    with caplog.at_level(logging.WARNING, logger="fusor.torch"):
        out = torch.compile(model, backend="fusor", options=AHEAD)(x, mask)
    assert out.requires_grad and len(_runtime._regions) == regions
    assert "computes forward passes only" in caplog.text
    out.sum().backward()
    assert model.attention.q.weight.grad is not None


@torch.inference_mode()
def test_a_kernel_that_loses_or_differs_is_not_used():
    torch.manual_seed(6)
    region = _runtime.FfnRegion("test", _runtime.Settings(rounds=3), activation="relu", transposed=True)
    x, w1, b1, w2 = torch.randn(16, 8), torch.randn(12, 8), torch.randn(12), torch.randn(8, 12)
    args = (x, w1, b1, w2, None, None, None)
    expected = region.original(*args)

    def slow(kernel, *a):
        time.sleep(0.005)
        return region.original(*a)

    verdict = _runtime.Verdict("chain slow", "cpu", state="ready")
    region._fused = slow
    torch.testing.assert_close(region._decide(verdict, *args), expected)
    assert verdict.state == "unfused" and "fusion does not pay here" in verdict.reason
    assert verdict.original_us < verdict.kernel_us

    verdict = _runtime.Verdict("chain wrong", "cpu", state="ready")
    region._fused = lambda kernel, *a: region.original(*a) + 1.0
    torch.testing.assert_close(region._decide(verdict, *args), expected)
    assert verdict.state == "unfused" and "differs from the original ops" in verdict.reason


@torch.inference_mode()
def test_hugging_face_models_run_with_their_chains_fused():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(7)
    ids = torch.randint(0, 100, (2, 16))
    attention_mask = torch.ones(2, 16, dtype=torch.long)
    attention_mask[1, 12:] = 0
    models = [
        transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=64, attn_implementation=impl))
        for impl in ("sdpa", "eager")] + [
        transformers.GPT2Model(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, attn_implementation="eager")),
        transformers.LlamaModel(transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         num_key_value_heads=2, intermediate_size=48))]
    for model in models:
        model.eval()
        expected = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
        regions = len(_runtime._regions)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="fusor", options=AHEAD)
        for _ in range(2):
            got = compiled(input_ids=ids, attention_mask=attention_mask).last_hidden_state
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        # The graph with every chain replaced registers its regions first; the graphs with only some winners
        # replaced, if built, after them.
        kinds = [r.kind for r in list(_runtime._regions.values())[regions:]]
        assert sorted(kinds[:4]) == ["attention", "attention", "ffn", "ffn"], (type(model).__name__, kinds)
    # GPT-2's and LLaMA's masks (causal and padding, one tensor under torch.compile) make causal softmaxes
    # that still read the mask; BERT's does not.
    texts = [r["text"] for r in chains("attention")]
    assert sum("softmax(n <= m) S[" in t and "M[" in t for t in texts) >= 2, texts
    assert any("softmax(n) S[" in t for t in texts), texts


def test_a_causal_mask_is_read_from_its_values():
    def offset(mask, *shape):  # an additive mask, expanded to the scores' shape as the region does
        shape = shape or mask.shape
        return _runtime._causal_offset((mask > -1e4).expand(shape), mask.expand(shape))

    m = 6
    tril = torch.ones(m, m, dtype=torch.bool).tril()
    causal = torch.zeros(m, m).masked_fill(~tril, torch.finfo(torch.float32).min)
    assert offset(causal, 2, 3, m, m) == (0, True)
    assert _runtime._causal_offset(tril.expand(2, 3, m, m)) == (0, True)  # a boolean one: where it keeps
    padded = causal.expand(2, 1, m, m).clone()
    padded[1, :, :, 4:] = torch.finfo(torch.float32).min  # the second sequence's last two keys are padding
    assert offset(padded, 2, 3, m, m) == (0, False)
    assert _runtime._causal_offset((padded > -1e4).expand(2, 3, m, m)) == (0, False)
    wider = torch.zeros(m, m).masked_fill(~torch.ones(m, m, dtype=torch.bool).tril(2), -1e9)
    assert offset(wider) == (2, True)
    assert offset(padded[:, :, :1, :], 2, 3, m, m) == (None, False)  # padding only
    leaky = causal.clone()
    leaky[0, m - 1] = 0  # the first query sees the last key: nothing to skip
    assert offset(leaky) == (None, False)
    biased = causal.clone()
    biased[3, 1] = 0.5  # kept, but not 0: the mask is read
    assert offset(biased) == (0, False)
    left_padded = padded.clone()
    left_padded[1, :, :, :2] = torch.finfo(torch.float32).min  # the second sequence's first query keeps no key
    assert offset(left_padded, 2, 3, m, m) == (None, False)
    assert offset(torch.zeros(2, 1, m, 1), 2, 3, m, m) == (None, False)  # keys broadcast: none masked


class Layers(nn.Module):
    def __init__(self, count=2, **sizes):
        super().__init__()
        self.layers = nn.ModuleList(Block(**sizes) for _ in range(count))

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return x


@torch.inference_mode()
def test_a_mask_shared_by_the_layers_is_read_once_per_forward_pass(monkeypatch):
    from fusor.torch import _dispatch, _graph
    torch.manual_seed(13)
    model, seq = Layers(hidden=24, heads=2, ffn=32).eval(), 10
    x = torch.randn(1, seq, 24)
    causal = torch.zeros(1, 1, seq, seq).masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(),
                                                     torch.finfo(torch.float32).min)
    padded = causal.clone()
    padded[..., seq - 2:] = torch.finfo(torch.float32).min  # the last two keys padding too: the mask is read
    compiled = compiled_and_checked(model, x, causal, calls=3)
    for mask in (padded, causal):  # new values, same shapes: each pass reads them anew
        torch.testing.assert_close(compiled(x, mask), model(x, mask), rtol=1e-5, atol=1e-5)

    # In the graph: one mask_form for both layers' attention, computed once per pass.
    captured = []
    torch._dynamo.reset()
    torch.compile(model, backend=lambda gm, inputs: captured.append((gm, inputs)) or gm.forward)(x, causal)
    gm, inputs = captured[0]
    _graph.rewrite(gm, _dispatch.parameters(gm, inputs), _runtime.Settings(tune="ahead", budget=2))
    forms = [n for n in gm.graph.nodes if n.target is torch.ops.fusor.mask_form.default]
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.fusor.attention.default]
    assert len(forms) == 1 and len(calls) == 2 and all(c.args[-1] is forms[0] for c in calls), gm.graph
    reads = []
    read = _runtime.AttentionRegion.mask_form
    monkeypatch.setattr(_runtime.AttentionRegion, "mask_form", lambda self, *a: reads.append(1) or read(self, *a))
    for mask in (causal, padded):
        torch.testing.assert_close(gm(*[mask if t is causal else t for t in inputs])[0], model(x, mask),
                                   rtol=1e-5, atol=1e-5)
    assert len(reads) == 2, reads
    # The causal mask went; the padded one is still read, by a causal softmax.
    texts = [r["text"] for r in chains("attention") if "m=10 n=10" in r["text"] and "softmax(n <= m)" in r["text"]]
    assert any("M[" not in t for t in texts) and any("M[" in t for t in texts), texts


@torch.inference_mode()
def test_new_sequence_lengths_share_the_kernel_of_their_range():
    torch.manual_seed(9)
    model = Block().eval()
    compiled = torch.compile(model, backend="fusor", options=AHEAD)
    for seq in (16, 20, 24):  # from the second new length on, dynamo captures the graph with symbolic sizes
        x, mask = torch.randn(2, seq, 32), padding_mask(2, seq, seq - 3)
        for _ in range(2):
            torch.testing.assert_close(compiled(x, mask), model(x, mask), rtol=1e-5, atol=1e-5)
    # 16 is in 2..16, 20 and 24 in 17..64 (the batch of 2 in 2..16): two kernels of attention, each taking the
    # sizes at every call.
    ranges = {r["range"] for r in chains("attention") if "dim z0=2 z1=4 m=" in r["text"] and "d=8" in r["text"]}
    assert ranges == {"z0=2..16 m=2..16 n=2..16", "z0=2..16 m=17..64 n=17..64"}, ft.report()


@torch.inference_mode()
def test_tuning_ahead_on_a_serving_machine_does_not_wait_for_itself(tmp_path):
    """tune="ahead" tunes a new range inside the request that meets it; a serving machine's worker holds its
    jobs while a request runs, so that request must not count as running while it waits."""
    import threading

    import fusor
    from conftest import BUILD, TEST_SCHEDULER

    torch.manual_seed(15)
    model = Gpt2Mlp(hidden=24, ffn=40).eval()  # sizes of its own: no other test's verdicts serve it
    with fusor.Client.embedded(bin_dir=BUILD, calibration_seconds=0.05, scheduler_args=TEST_SCHEDULER, serving=True,
                               cache_dir=tmp_path) as client:
        ft.set_client(client)
        compiled = torch.compile(model, backend="fusor", options=AHEAD)
        # 40 and 100 rows are tuned while dynamo compiles (static, then symbolic sizes); 8 rows, a range of its
        # own, inside the symbolic graph's call.
        for rows in (40, 100, 8):
            x, out = torch.randn(1, rows, 24), []

            def call():
                with torch.inference_mode():  # (a thread's own mode)
                    out.append(compiled(x))

            request = threading.Thread(target=call, daemon=True)
            request.start()
            request.join(timeout=300)
            assert not request.is_alive(), f"the request of {rows} rows waits for a tune it holds"
            torch.testing.assert_close(out[0], model(x), rtol=1e-5, atol=1e-5)
        ranges = {r["range"] for r in chains("ffn") if "c=24" in r["text"] and r["state"] != "failed"}
        assert ranges == {"m=2..16", "m=17..64", "m=65..256"}, ft.report()


class CachedDecoder(nn.Module):
    """One decoder layer with a growing KV cache, as a serving loop calls it: the new tokens' keys and values
    appended to the cache's, attention over all of them (causal in the prompt, every key in a decode step)."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.qkv, self.o = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)

    def forward(self, x, past_k, past_v):
        b, s, hidden = x.shape
        q, k, v = (t.view(b, s, self.heads, self.dim).transpose(1, 2) for t in self.qkv(x).split(hidden, dim=-1))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1)
        return self.o(out.transpose(1, 2).reshape(b, s, hidden)), k, v


def serve(compiled, model, requests):
    """Each request (batch, length) through the compiled model, checked against eager."""
    for batch, seq in requests:
        x, mask = torch.randn(batch, seq, 32), padding_mask(batch, seq, seq - 3)
        torch.testing.assert_close(compiled(x, mask), model(x, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamic", [None, True, False])
@torch.inference_mode()
def test_traffic_of_many_lengths_never_raises(dynamic):
    """The sequence that raised: three lengths, the tunes waited for, the same three again; then the batch
    changes too. Whatever dynamo hands the backend (static graphs, then symbolic sizes; symbolic from the
    start; a graph per shape), every call answers as eager does."""
    torch.manual_seed(13)
    model = Block().eval()
    compiled = torch.compile(model, backend="fusor", dynamic=dynamic, options={"budget": 2})
    lengths = [(1, 19), (1, 11), (1, 23)]
    serve(compiled, model, lengths)
    assert ft.wait(timeout=600)
    serve(compiled, model, lengths + lengths)
    serve(compiled, model, [(2, 11), (3, 19), (1, 1), (1, 30)])


@torch.inference_mode()
def test_a_growing_kv_cache_never_raises():
    """A prompt, then decode steps of one token each, the cache one key longer at every step."""
    torch.manual_seed(14)
    model = CachedDecoder().eval()
    compiled = torch.compile(model, backend="fusor", options={"rest": "eager", "budget": 2})
    empty = torch.zeros(1, 4, 0, 8)
    for prompt in (9, 5):
        x = torch.randn(1, prompt, 32)
        k = v = empty
        ek = ev = empty
        for step in range(6):
            out, k, v = compiled(x, k, v)
            expected, ek, ev = model(x, ek, ev)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            x = torch.randn(1, 1, 32)
            if step == 2:
                assert ft.wait(timeout=600)


@torch.inference_mode()
def test_inputs_the_kernels_cannot_take_run_the_original_ops(caplog):
    """Empty tensors and a dtype change between calls: the original ops answer (they raise where eager does),
    once said, nothing tuned for them."""
    torch.manual_seed(15)
    model = Block().eval()
    compiled = torch.compile(model, backend="fusor", options={"rest": "eager", "budget": 2})
    serve(compiled, model, [(1, 7)])
    before = {r["text"] for r in ft.report()}
    with caplog.at_level(logging.INFO, logger="fusor.torch"):
        x, mask = torch.randn(0, 7, 32), padding_mask(1, 7, 4)[:0]
        torch.testing.assert_close(compiled(x, mask), model(x, mask))
    assert "no elements" in caplog.text
    model64 = Block().eval().double()
    compiled64 = torch.compile(model64, backend="fusor", options={"rest": "eager", "budget": 2})
    x, mask = torch.randn(1, 7, 32, dtype=torch.float64), padding_mask(1, 7, 4).double()
    torch.testing.assert_close(compiled64(x, mask), model64(x, mask))
    assert {r["text"] for r in ft.report()} == before
