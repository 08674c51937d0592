#!/usr/bin/env python3
"""Exports small transformer models the way users export them, as test
fixtures for fusor's ONNX importer (tests/common/zoo/onnx_exports_test.cc).

Models are built from small configs with random weights (nothing is
downloaded) and exported with PyTorch's TorchScript exporter (opset 17) and
its dynamo exporter (opset 18), each with eager and with SDPA attention; the
TorchScript BERT export also goes through onnxruntime's transformer
optimizer, and GPT-2 and LLaMA are exported in float16 too (eager attention,
both exporters: their scales and mask fills become FLOAT16 scalars). Only the graphs are kept: every tensor of 1 KiB or more is moved
to external data, which is then deleted, so the files stay small and the
importer sees what it sees when a model's weights are elsewhere.

Needs torch, transformers, onnx, onnxscript and onnxruntime (PyPI); the test
suite reads the committed .onnx files and needs none of them.

    python3 tests/common/zoo/exports/make_exports.py [OUT_DIR] [MODEL...]

MODEL: bert, gpt2, t5, vit, llama (the fixtures, the default) or bert_base
(BERT-base's sizes, to time `fusor extract` on; not a fixture).
"""
import os
import re
import sys
import tempfile
import warnings

import onnx
import torch
import transformers

LAYERS, HIDDEN, HEADS, FFN = 2, 64, 4, 256


class Text(torch.nn.Module):
    """model(input_ids, attention_mask).last_hidden_state, as the wrapper a
    user writes for export."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Vision(Text):
    """model(pixel_values).last_hidden_state."""

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).last_hidden_state


def text(model):
    """`model` over token ids and an attention mask of [batch, seq]."""
    ids = torch.randint(0, 128, (2, 16))
    return Text(model), (ids, torch.ones_like(ids)), {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask")}


def bert(attn, layers=LAYERS, hidden=HIDDEN, heads=HEADS, ffn=FFN):
    config = transformers.BertConfig(vocab_size=128, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=ffn,
                                     max_position_embeddings=512, attn_implementation=attn)
    return text(transformers.BertModel(config, add_pooling_layer=False).eval())


def bert_base(attn):
    """BERT-base's sizes (12 layers, hidden 768): for timing `fusor extract`;
    made only when named, never committed (200 KB of graph)."""
    return bert(attn, layers=12, hidden=768, heads=12, ffn=3072)


def gpt2(attn):
    config = transformers.GPT2Config(vocab_size=128, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=FFN,
                                     n_positions=512, attn_implementation=attn)
    return text(transformers.GPT2Model(config).eval())


def t5(attn):
    config = transformers.T5Config(vocab_size=128, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN,
                                   num_layers=LAYERS, num_heads=HEADS, feed_forward_proj="relu",
                                   attn_implementation=attn)
    return text(transformers.T5EncoderModel(config).eval())


def vit(attn):
    config = transformers.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                    intermediate_size=FFN, image_size=32, patch_size=8, attn_implementation=attn)
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    return Vision(model), (torch.randn(2, 3, 32, 32),), {"pixel_values": {0: "batch"}}


def llama(attn):
    """LLaMA with grouped-query attention: 4 query heads over 2 K/V heads,
    which transformers repeats (repeat_kv) before the attention."""
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
                                      intermediate_size=FFN, max_position_embeddings=512, attn_implementation=attn)
    return text(transformers.LlamaModel(config).eval())


MODELS = {"bert": bert, "gpt2": gpt2, "t5": t5, "vit": vit, "llama": llama, "bert_base": bert_base}
FIXTURES = ["bert", "gpt2", "t5", "vit", "llama"]
HALF = ["gpt2", "llama"]  # also exported in float16, eager attention


def graph_only(path, out_path):
    """Saves the model at `path` to `out_path` with its large tensors'
    external data removed and no per-node annotations."""
    model = onnx.load(path)
    # The dynamo exporter annotates every node with its stack trace.
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    with tempfile.TemporaryDirectory() as tmp:
        staged = os.path.join(tmp, os.path.basename(out_path))
        onnx.save_model(model, staged, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(out_path) + ".data", size_threshold=1024)
        graph = onnx.load(staged, load_external_data=False)
    onnx.save_model(graph, out_path)


def export(name, make, attn, exporter, out_dir, half=False):
    model, args, dims = make(attn)
    if half:
        model = model.half()
        args = tuple(a.half() if a.is_floating_point() else a for a in args)
    inputs, outputs = list(dims), ["last_hidden_state"]
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "model.onnx")
        if exporter == "torchscript":
            dynamic = dict(dims, last_hidden_state=next(iter(dims.values())))
            torch.onnx.export(model, args, raw, input_names=inputs, output_names=outputs, opset_version=17,
                              dynamic_axes=dynamic, dynamo=False)
        else:
            shared = {"batch": torch.export.Dim("batch"), "seq": torch.export.Dim("seq", max=512)}
            shapes = {n: {axis: shared[d] for axis, d in axes.items()} for n, axes in dims.items()}
            program = torch.onnx.export(model, args, input_names=inputs, output_names=outputs, opset_version=18,
                                        dynamic_shapes=shapes, dynamo=True)
            program.save(raw)
        out = os.path.join(out_dir, f"{name}_{exporter}_{attn}{'_f16' if half else ''}.onnx")
        graph_only(raw, out)
        print("wrote", out, os.path.getsize(out), "bytes")
        if name == "bert" and exporter == "torchscript" and attn == "eager" and not half:
            from onnxruntime.transformers import optimizer
            optimized = optimizer.optimize_model(raw, model_type="bert", num_heads=HEADS, hidden_size=HIDDEN,
                                                 opt_level=0)
            staged = os.path.join(tmp, "optimized.onnx")
            optimized.save_model_to_file(staged)
            out = os.path.join(out_dir, f"{name}_ort_optimized.onnx")
            graph_only(staged, out)
            print("wrote", out, os.path.getsize(out), "bytes")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore")
    print("torch", torch.__version__, "transformers", transformers.__version__, "onnx", onnx.__version__)
    names = sys.argv[2:] or FIXTURES
    for name in names:
        make = MODELS[name]
        for exporter in ("torchscript", "dynamo"):
            variants = [("eager", False), ("sdpa", False)] + ([("eager", True)] if name in HALF else [])
            for attn, half in variants:
                try:
                    export(name, make, attn, exporter, out_dir, half)
                except Exception as e:  # an export PyTorch itself cannot make: no fixture
                    why = re.sub(r"\x1b\[[0-9;]*m", "", str(e).splitlines()[0])
                    print(f"skipped {name}_{exporter}_{attn}{'_f16' if half else ''}: {type(e).__name__}: {why}")


if __name__ == "__main__":
    main()
