"""fusor.torch: attention and GEMM chains on PyTorch CPU tensors (skipped without PyTorch)."""

import pytest

torch = pytest.importorskip("torch")

import fusor  # noqa: E402
import fusor.torch as ft  # noqa: E402


@pytest.fixture(autouse=True)
def helpers_use_the_test_client(client):
    ft.set_client(client)
    yield
    ft.set_client(None)


def reference_attention(q, k, v, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v.double()


@torch.no_grad()
def test_attention_on_4d_tensors_with_a_bert_mask():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, :, :, 12:] = -10000.0
    out = ft.attention(q, k, v, mask=mask, budget=2)
    assert out.shape == (2, 3, 16, 8) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask), rtol=1e-4, atol=1e-5)
    # A boolean mask (True: attend) means the same; the kernel is kept, not asked for again.
    kept = dict(ft._helpers._kernels)
    out_bool = ft.attention(q, k, v, mask=mask == 0)
    torch.testing.assert_close(out_bool, out, rtol=1e-4, atol=1e-5)
    assert ft._helpers._kernels.keys() == kept.keys()


@torch.no_grad()
def test_attention_without_batch_dims_with_a_scale_on_transposed_inputs():
    torch.manual_seed(1)
    q = torch.randn(8, 12)
    k = torch.randn(12, 20).t()  # not contiguous: read in place
    v = torch.randn(20, 4)
    out = ft.attention(q, k, v, scale=0.5, budget=2)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, scale=0.5), rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_gemm_chain_with_bias_and_gelu_matches_torch():
    torch.manual_seed(2)
    x = torch.randn(2, 8, 16)
    w1, b1, w2 = torch.randn(16, 32), torch.randn(32), torch.randn(32, 12)
    y = ft.gemm_chain(x, w1, w2, bias=b1, activation="gelu", budget=2)
    ref = torch.nn.functional.gelu(x.double() @ w1.double() + b1.double()) @ w2.double()
    assert y.shape == (2, 8, 12)
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)
    plain = ft.gemm_chain(x, w1, w2, budget=2)
    torch.testing.assert_close(plain.double(), x.double() @ w1.double() @ w2.double(), rtol=1e-4, atol=1e-4)


def test_helpers_refuse_what_they_cannot_run():
    q = torch.randn(4, 8)
    with pytest.raises(fusor.KernelArgumentError, match="requires grad"):
        ft.attention(q.requires_grad_(), q, q)
    with torch.no_grad():
        with pytest.raises(fusor.KernelArgumentError, match="same rank"):
            ft.attention(torch.randn(4, 8), torch.randn(1, 4, 8), torch.randn(4, 8))
        with pytest.raises(fusor.KernelArgumentError, match="k is torch.float64"):
            ft.attention(torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8))
        with pytest.raises(fusor.KernelArgumentError, match="does not broadcast"):
            ft.attention(torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 8), mask=torch.zeros(3, 5))
        with pytest.raises(fusor.KernelArgumentError, match="activation 'swish'"):
            ft.gemm_chain(torch.randn(2, 4), torch.randn(4, 4), torch.randn(4, 4), activation="swish")
        with pytest.raises(fusor.KernelArgumentError, match="do not chain"):
            ft.gemm_chain(torch.randn(2, 4), torch.randn(5, 4), torch.randn(4, 4))


def test_a_kernel_takes_cpu_tensors_and_returns_tensors(client):
    from conftest import ATTENTION

    kernel = client.compile(ATTENTION, budget=2)
    q, k, v = (torch.randn(s.shape) for s in kernel.inputs)
    out = kernel(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 32, 24)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, scale=0.25), rtol=1e-4, atol=1e-5)
    with pytest.raises(fusor.KernelArgumentError, match="must be torch.float32, got torch.float16"):
        kernel(q, k, v.half())
    with pytest.raises(fusor.KernelArgumentError, match="must be contiguous"):
        kernel(q, k, v.transpose(1, 2).contiguous().transpose(1, 2))
