#!/usr/bin/env python3
"""Static kernel-quality figures for sm_90 kernels, read from their cubins
with nvdisasm; no GPU needed.

    python3 bench/gpu/sass_stats.py DIR [--json OUT.json] [--nvdisasm PATH]

DIR holds pairs <stem>.cubin and <stem>.json (chain, label, kernel, arch,
sm_count, grid, threads, dynamic_shared_bytes, static_shared_bytes,
registers, spill_store_bytes, spill_load_bytes). One Markdown row per pair.

Rules (analyze_sass works on `nvdisasm -c` text and is pure):
- Function: the kernel named in the JSON (or its C++ mangled name; else the
  first entry function). Device subroutines (__cuda_sm20_div_s64, ...) are
  functions of their own: a loop's CALLs count, not the callee's body.
- Instructions: one per address; labels, NOPs and `@!PT` instructions
  (never executed: ptxas pads LDGSTS with `@!PT LDS RZ, [RZ]`) are left
  out; any other predicated instruction counts. HMMA = mma.sync only
  (HGMMA, the warpgroup wgmma, is not counted).
- Loops: a BRA whose target label is at or before it; body = the label's
  instruction through the last such branch back to it (nested loops included).
  Main loop = the loop with the most HMMAs, ties to the smallest body (so
  the innermost of nested loops with the same HMMAs). No loop with an HMMA
  (fully unrolled): the whole function, reported as "no loop".
- Bytes per warp (32 threads): LDS/STS 32 x {U8,S8: 1; U16,S16: 2; plain: 4;
  .64: 8; .128: 16}; LDSM/STSM (.16.M88 or .MT88) 128 per 8x8 matrix: plain
  128, .2 256, .4 512; LDGSTS (cp.async, global->shared) 32 x {4; .64: 8;
  .128: 16}. Reads = LDS + LDSM; writes = STS + STSM.
- Runtime div/mod: an `I2F*.RP` (the start of the reciprocal sequence,
  I2F.RP, MUFU.RCP, IMAD.HI, ptxas emits for 32-bit / and % by a runtime
  value; a / and % by the same divisor share one) or a CALL to an integer
  division subroutine (64-bit; ptxas adds a 32-bit fast path, so one 64-bit
  division counts 2). Given for the loop and for the whole function.
- Occupancy for compute capability 9.0 as cuda_occupancy.h (CUDA 13)
  computes it: registers per warp = regs x 32 rounded up to 256, 65536 per
  SM in 4 sub-partitions of 16384 each holding whole warps; shared memory
  per block = dynamic + static + 1024 reserved, rounded up to 128, out of
  233472 (228 KiB, the largest carveout); at most 64 warps and 32 blocks.
  Waves = grid / (blocks/SM x sm_count).
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s*\{?\s*(@!?U?P\w+\s+)?([A-Z][\w.]*)(.*?)\s*;?\s*\}?\s*$")
LABEL = re.compile(r"^([.$\w]+):\s*$")
FUNCTION = re.compile(r"^\s*\.type\s+([^,\s]+)\s*,\s*@function")
ENTRY = re.compile(r"^\s*\.other\s+([^,\s]+)\s*,.*STO_CUDA_ENTRY")
TARGET = re.compile(r"`\(([^)]+)\)")
INT_DIV_CALL = re.compile(r"_(div|rem)_[su](16|32|64)\b")
LDS_SIZE = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
SM90 = dict(regs_per_sm=65536, sub_partitions=4, reg_unit=256, smem_per_sm=233472, smem_reserved=1024,
            smem_unit=128, max_warps=64, max_blocks=32)


def parse_functions(text):
    """({function: {"instrs": [(address, predicate, opcode, operands)], "labels": {label: address}}}, entries)."""
    functions, entries, current, pending = {}, [], None, []
    for line in text.splitlines():
        if m := FUNCTION.match(line):
            current = functions.setdefault(m.group(1), {"instrs": [], "labels": {}})
            pending = []
        elif m := ENTRY.match(line):
            entries.append(m.group(1))
        elif current is None:
            continue
        elif m := LABEL.match(line.strip()):
            pending.append(m.group(1))
        elif m := INSTR.match(line):
            addr = int(m.group(1), 16)
            for label in pending:
                current["labels"][label] = addr
            pending = []
            current["instrs"].append((addr, (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return functions, entries


def shared_bytes(opcode):
    """(reads, writes, global->shared) bytes per warp of one instruction."""
    parts = opcode.split(".")
    op, mods = parts[0], parts[1:]
    if op in ("LDS", "STS"):
        size = next((LDS_SIZE[m] for m in mods if m in LDS_SIZE), 4) * 32
        return (size, 0, 0) if op == "LDS" else (0, size, 0)
    if op in ("LDSM", "STSM"):
        size = 128 * {"2": 2, "4": 4}.get(mods[-1] if mods else "", 1)
        return (size, 0, 0) if op == "LDSM" else (0, size, 0)
    if op == "LDGSTS":
        return 0, 0, 32 * next((LDS_SIZE[m] for m in mods if m in ("64", "128")), 4)
    return 0, 0, 0


def is_div(opcode, operands):
    parts = opcode.split(".")
    return (parts[0] == "I2F" and "RP" in parts) or (parts[0] == "CALL" and bool(INT_DIV_CALL.search(operands)))


def analyze_sass(text, kernel=None):
    """The main loop's figures for one function of nvdisasm text (see the module docstring)."""
    functions, entries = parse_functions(text)
    if not functions:
        raise ValueError("no function in the SASS text")
    named = [f for f in functions if kernel and (f == kernel or f.startswith(f"_Z{len(kernel)}{kernel}"))]
    name = (named or [e for e in entries if e in functions] or list(functions))[0]
    fn = functions[name]
    instrs = [i for i in fn["instrs"] if i[2] != "NOP" and i[1] != "@!PT"]
    instrs = list({i[0]: i for i in instrs}.values())  # one per address
    loops = {}  # start address -> (label, end address)
    for addr, _, opcode, operands in instrs:
        target = TARGET.search(operands) if opcode.split(".")[0] == "BRA" else None
        start = fn["labels"].get(target.group(1)) if target else None
        if start is not None and start <= addr:  # a backward branch
            loops[start] = (target.group(1), max(addr, loops.get(start, ("", -1))[1]))
    hmma = lambda body: sum(i[2].startswith("HMMA") for i in body)
    best = None
    for start, (label, end) in loops.items():
        body = [i for i in instrs if start <= i[0] <= end]
        key = (hmma(body), -len(body))
        if key[0] > 0 and (best is None or key > best[0]):
            best = (key, label, start, end, body)
    body = best[4] if best else instrs
    reads = writes = async_copy = 0
    mufu = {}
    for _, _, opcode, _ in body:
        r, w, a = shared_bytes(opcode)
        reads, writes, async_copy = reads + r, writes + w, async_copy + a
        if opcode.startswith("MUFU."):
            kind = opcode.split(".")[1]
            mufu[kind] = mufu.get(kind, 0) + 1
    n_hmma = hmma(body)
    per = lambda v: round(v / n_hmma, 2) if n_hmma else None
    return {
        "function": name,
        "loop": {"label": best[1], "start": best[2], "end": best[3]} if best else None,
        "loops": len(loops),
        "instructions": len(body),
        "hmma": n_hmma,
        "instr_per_hmma": per(len(body)),
        "smem_read_bytes": reads,
        "smem_write_bytes": writes,
        "ldgsts_bytes": async_copy,
        "smem_read_per_hmma": per(reads),
        "smem_write_per_hmma": per(writes),
        "ldgsts_per_hmma": per(async_copy),
        "bar": sum(i[2] == "BAR" or i[2].startswith("BAR.") for i in body),
        "mufu": sum(mufu.values()),
        "mufu_kinds": mufu,
        "divmod": sum(is_div(i[2], i[3]) for i in body),
        "divmod_function": sum(is_div(i[2], i[3]) for i in instrs),
    }


def occupancy(threads, registers, smem_bytes, c=SM90):
    """(blocks per SM, what limits it) for sm_90; smem_bytes = dynamic + static shared memory per block."""
    warps = -(-threads // 32)
    if warps == 0 or threads > 1024:
        return 0, "threads"
    limits = {"warps": c["max_warps"] // warps, "blocks": c["max_blocks"]}
    regs_per_warp = -(-max(registers, 1) * 32 // c["reg_unit"]) * c["reg_unit"]
    parts = c["sub_partitions"]
    if registers > 256 or regs_per_warp * (-(-warps // parts) * parts) > c["regs_per_sm"]:
        limits["registers"] = 0
    else:
        limits["registers"] = (c["regs_per_sm"] // parts // regs_per_warp) * parts // warps
    smem = -(-(smem_bytes + c["smem_reserved"]) // c["smem_unit"]) * c["smem_unit"]
    limits["shared memory"] = c["smem_per_sm"] // smem
    limiter = min(limits, key=limits.get)
    return limits[limiter], limiter


def find_nvdisasm(explicit=None):
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    candidates = [os.environ.get("NVDISASM"), shutil.which("nvdisasm"), "/usr/local/cuda/bin/nvdisasm"]
    for base in sys.path:  # this Python's PyPI wheel: nvidia/cu13/bin/nvdisasm (12.x: nvidia/cuda_nvdisasm/bin/...)
        candidates += sorted(glob.glob(os.path.join(base or ".", "nvidia", "*", "bin", "nvdisasm")))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def kernel_row(cubin, nvdisasm):
    meta = json.loads(cubin.with_suffix(".json").read_text())
    missing = [k for k in ("grid", "threads", "registers") if k not in meta]
    if missing:
        raise ValueError(f"{cubin.with_suffix('.json')}: no {', '.join(missing)}")
    run = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{nvdisasm} -c {cubin} failed: {run.stderr.strip()}")
    if meta.get("arch", "sm_90") != "sm_90":
        print(f"warning: {cubin.name}: arch {meta['arch']}, occupancy uses sm_90's limits", file=sys.stderr)
    smem = meta.get("dynamic_shared_bytes", 0) + meta.get("static_shared_bytes", 0)
    blocks, limiter = occupancy(meta["threads"], meta["registers"], smem)
    resident = blocks * meta.get("sm_count", 132)
    return {**meta, "cubin": cubin.name, "shared_bytes_per_block": smem, "blocks_per_sm": blocks,
            "occupancy_limiter": limiter, "waves": round(meta["grid"] / resident, 4) if resident else None,
            "sass": analyze_sass(run.stdout, meta.get("kernel"))}


def markdown(rows):
    cols = ["chain", "label", "regs", "spills (B)", "smem/block (KB)", "blocks/SM", "grid", "grid/SMs", "waves",
            "HMMA in loop",
            "instr/HMMA", "LDS+LDSM B/HMMA", "STS B/HMMA", "BAR", "MUFU", "div/mod"]
    num = lambda v: "-" if v is None else f"{v:g}"
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        s = r["sass"]
        cells = [r.get("chain", "?"), r.get("label", "?"), r["registers"],
                 f"{r.get('spill_store_bytes', 0)}/{r.get('spill_load_bytes', 0)}",
                 f"{r['shared_bytes_per_block'] / 1024:.1f}", f"{r['blocks_per_sm']} ({r['occupancy_limiter']})",
                 r["grid"], f"{r['grid'] / r.get('sm_count', 132):.2f}",
                 "-" if r["waves"] is None else f"{r['waves']:.2f}",
                 f"{s['hmma']}" + ("" if s["loop"] else " (no loop)"), num(s["instr_per_hmma"]),
                 num(s["smem_read_per_hmma"]), num(s["smem_write_per_hmma"]), s["bar"], s["mufu"],
                 f"{s['divmod']} (fn {s['divmod_function']})"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--json", type=Path, help="also write every figure to this file")
    ap.add_argument("--nvdisasm", help="the nvdisasm binary (default: PATH, /usr/local/cuda/bin, the PyPI wheel)")
    ap.add_argument("--label", help="only the kernels with this label (e.g. candidate_0: the model's pick)")
    args = ap.parse_args(argv)
    nvdisasm = find_nvdisasm(args.nvdisasm)
    if not nvdisasm:
        print("error: nvdisasm not found" + (f" at {args.nvdisasm}" if args.nvdisasm else "") +
              "; install it with `pip install nvidia-cuda-nvdisasm` or pass --nvdisasm PATH", file=sys.stderr)
        return 2
    cubins = sorted(c for c in args.dir.glob("*.cubin") if c.with_suffix(".json").exists())
    if args.label:
        cubins = [c for c in cubins if json.loads(c.with_suffix(".json").read_text()).get("label") == args.label]
    if not cubins:
        print(f"error: no <stem>.cubin with <stem>.json in {args.dir}", file=sys.stderr)
        return 2
    try:
        rows = [kernel_row(c, nvdisasm) for c in cubins]
    except (OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
