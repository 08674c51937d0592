#!/usr/bin/env python3
"""The device check's summary table from its log (RESULT and TORCH lines)."""
import re
import sys


def fields(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def main(path):
    results, torch, header = {}, {}, []
    for line in open(path):
        if line.startswith(("DEVICE", "CEILING")):
            header.append(line.strip())
        elif line.startswith("RESULT"):
            f = fields(line)
            results[f["chain"]] = f
        elif line.startswith("TORCH chain="):
            f = fields(line)
            torch[f["chain"]] = f
    print("\n".join(header))
    cols = ["chain", "fused us", "unfused cuBLAS us", "vs cuBLAS", "torch chain us", "SDPA us", "vs PyTorch", "TB/s",
            "% copy BW", "TFLOP/s", "% mma peak"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for name, r in sorted(results.items()):
        fused, base = float(r["fused_us"]), float(r["baseline_us"])
        t = torch.get(name, {})
        tm, sd = float(t.get("matmul_us", -1)), float(t.get("sdpa_us", -1))
        peer = min([x for x in (tm, sd) if x > 0], default=-1)
        ok = fused > 0
        tbps = float(r["min_bytes"]) / (fused * 1e-6) / 1e12 if ok else 0
        tflops = float(r["flops"]) / (fused * 1e-6) / 1e12 if ok else 0
        cell = lambda v: f"{v:.1f}" if v > 0 else "-"
        ratio = lambda v: f"{v / fused:.2f}x" if ok and v > 0 else "-"
        share = lambda v, ceiling: f"{100 * v / ceiling:.0f}%" if ok and ceiling > 0 else "-"  # no calibration: -
        print(f"| {name} | {cell(fused)} | {cell(base)} | {ratio(base)} | {cell(tm)} | {cell(sd)} | {ratio(peer)} | "
              f"{tbps:.2f} | {share(tbps * 1e12, float(r['copy_Bps']))} | {tflops:.1f} | "
              f"{share(tflops * 1e12, float(r['mma_flops']))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
