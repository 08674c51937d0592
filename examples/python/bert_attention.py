"""Swaps the self-attention of a Hugging Face BERT encoder for fusor's tuned fused attention, and checks
that the model's outputs do not change.

    python examples/python/bert_attention.py [--layers 2] [--seq 128] [--batch 2] [--budget 8]

Needs torch and transformers (pip install torch transformers). The model is BERT-base's shape with
random weights (nothing is downloaded). Kernels come from the scheduler at $FUSOR_SERVER, or from an
embedded scheduler and worker started for the run.
"""

import argparse
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
    args = parser.parse_args()

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=args.layers, attn_implementation="eager")
    model = BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    mask[-1, args.seq * 3 // 4:] = 0  # the last sequence is padded

    with torch.no_grad():
        started = time.perf_counter()
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        eager_s = time.perf_counter() - started
        for layer in model.encoder.layer:
            fused = FusedSelfAttention(layer.attention.self)
            fused.budget = args.budget
            layer.attention.self = fused
        model(input_ids=ids, attention_mask=mask)  # tunes (or finds in the cache) and builds the kernel
        started = time.perf_counter()
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        fused_s = time.perf_counter() - started

    error = (got - expected).abs().max().item()
    kept = mask.bool()
    print(f"BERT, {args.layers} layers, batch {args.batch}, {args.seq} tokens: max |fused - eager| = {error:.2e} "
          f"over the unpadded tokens {(got - expected)[kept].abs().max().item():.2e}")
    print(f"one forward pass: eager {eager_s * 1e3:.1f} ms, with fusor's attention {fused_s * 1e3:.1f} ms "
          "(single runs, for orientation only)")
    ok = torch.allclose(got[kept], expected[kept], rtol=1e-3, atol=1e-3)
    print("outputs match" if ok else "OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
