"""Swaps the self-attention of a Hugging Face BERT encoder for fusor's tuned fused attention, and checks
that the model's outputs do not change.

    python examples/python/bert_attention.py [--layers 2] [--seq 128] [--batch 2] [--budget 8] [--repeats 10]

Needs torch and transformers (pip install torch transformers). The model is BERT-base's shape with
random weights (nothing is downloaded). Kernels come from the scheduler at $FUSOR_SERVER, or from an
embedded scheduler and worker started for the run.
"""

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertModel

import fusor.torch as ft


class FusedSelfAttention(torch.nn.Module):
    """BertSelfAttention's projections, then softmax(q kᵀ/√d + mask) v as one fusor kernel."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.query, self.key, self.value = original.query, original.key, original.value
        self.heads, self.head_size = original.num_attention_heads, original.attention_head_size
        self.budget = 0

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        batch, seq, _ = hidden_states.shape

        def heads(x):
            return x.view(batch, seq, self.heads, self.head_size).transpose(1, 2)

        q, k, v = heads(self.query(hidden_states)), heads(self.key(hidden_states)), heads(self.value(hidden_states))
        out = ft.attention(q, k, v, mask=attention_mask, budget=self.budget)  # [batch, heads, seq, head_size]
        return out.transpose(1, 2).reshape(batch, seq, -1), None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--budget", type=int, default=8, help="candidates measured when tuning the attention")
    parser.add_argument("--repeats", type=int, default=10, help="forward passes timed with each attention")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=args.layers, attn_implementation="eager")
    model = BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    mask[-1, args.seq * 3 // 4:] = 0  # the last sequence is padded

    originals = [layer.attention.self for layer in model.encoder.layer]
    fused = []
    for original in originals:
        f = FusedSelfAttention(original)
        f.budget = args.budget
        fused.append(f)

    def use(modules):
        for layer, module in zip(model.encoder.layer, modules):
            layer.attention.self = module

    def forward():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    with torch.no_grad():
        expected = forward()
        use(fused)
        got = forward()  # tunes the attention (or finds it in the cache) and builds its kernel
        times = {"eager": [], "fusor": []}
        for _ in range(args.repeats):  # alternating, so both see the same machine
            for name, modules in (("eager", originals), ("fusor", fused)):
                use(modules)
                started = time.perf_counter()
                forward()
                times[name].append(time.perf_counter() - started)

    kept = mask.bool()
    error = (got - expected)[kept].abs().max().item()
    print(f"BERT, {args.layers} layers, batch {args.batch}, {args.seq} tokens: max |fused - eager| = {error:.2e} "
          "over the tokens that are not padding")
    eager_ms, fusor_ms = (statistics.median(times[k]) * 1e3 for k in ("eager", "fusor"))
    print(f"one forward pass, median of {args.repeats}: eager attention {eager_ms:.1f} ms, fusor's {fusor_ms:.1f} ms")
    ok = torch.allclose(got[kept], expected[kept], rtol=1e-3, atol=1e-3)
    print("outputs match" if ok else "OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
