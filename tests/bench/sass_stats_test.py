#!/usr/bin/env python3
"""Tests for bench/gpu/sass_stats.py: the SASS analysis on a committed nvdisasm
fixture (tests/bench/data/sass_loop_sm90.txt, from sass_loop_sm90.cu) and on
small hand-written listings, the sm_90 occupancy, and the command line (end to
end when nvcc and nvdisasm are at hand).

    python3 tests/bench/sass_stats_test.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "bench" / "data"
SCRIPT = ROOT / "bench" / "gpu" / "sass_stats.py"
sys.path.insert(0, str(SCRIPT.parent))
import sass_stats  # noqa: E402

NESTED = """
        .type           _Z11fusor_fusedPKfPf,@function
        .other          _Z11fusor_fusedPKfPf,@"STO_CUDA_ENTRY STV_DEFAULT"
_Z11fusor_fusedPKfPf:
        /*0000*/                   MOV R0, RZ ;
.L_x_0:
        /*0010*/                   LDS.128 R8, [R2] ;
.L_x_1:
        /*0020*/                   LDSM.16.M88.4 R4, [R3] ;
        /*0030*/                   HMMA.16816.F32 R12, R4, R8, R12 ;
        /*0040*/                   HMMA.16816.F32 R16, R4, R10, R16 ;
        /*0050*/                   NOP ;
        /*0060*/               @P0 BRA `(.L_x_1) ;
        /*0070*/                   STS.U16 [R2], R0 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/               @P1 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
.L_x_2:
        /*00b0*/                   BRA `(.L_x_2);
"""

DIVMOD = """
        .type           k,@function
k:
        /*0000*/                   HMMA.16816.F32 R12, R4, R8, R12 ;
        /*0010*/                   I2F.U32.RP R0, UR4 ;
        /*0020*/                   MUFU.RCP R0, R0 ;
        /*0030*/                   HMMA.16816.F32 R16, R4, R8, R16 ;
.L_x_0:
        /*0040*/                   MUFU.RCP R8, R11 ;
        /*0050*/                   CALL.REL.NOINC `($__internal_1_$__cuda_sm3x_div_rn_noftz_f32_slowpath) ;
        /*0060*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm20_rem_u64) ;
        /*0070*/              @!PT LDS RZ, [RZ] ;
        /*0080*/                   MUFU.EX2 R9, R9 ;
        /*0090*/               @P0 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
        .type           $__internal_0_$__cuda_sm20_rem_u64,@function
$__internal_0_$__cuda_sm20_rem_u64:
        /*00b0*/                   I2F.U64.RP R12, UR4 ;
        /*00c0*/                   HMMA.16816.F32 R16, R4, R8, R16 ;
        /*00d0*/                   RET.REL.NODEC R8 `(k) ;
"""


class AnalyzeSassTest(unittest.TestCase):
    def test_fixture(self):
        # Verified by hand on the listing: the loop .L_x_2 runs from 0x05b0 to the @!P1 BRA at 0x0a90, 79
        # instructions of which 3 are `@!PT LDS RZ, [RZ]` padding; LDSM.16.M88.4 x2 (512 B) and
        # LDSM.16.MT88.2 x8 (256 B) = 3072 B; LDGSTS.E.BYPASS.128 x3 (512 B) = 1536 B; 2 BAR.SYNC (not the
        # DEPBAR); 4 MUFU.EX2 from the exp2f; the prologue's blockIdx.x / ncols and % ncols share one
        # I2F.U32.RP + MUFU.RCP sequence outside the loop.
        s = sass_stats.analyze_sass((DATA / "sass_loop_sm90.txt").read_text(), "loop_kernel")
        self.assertEqual(s["function"], "loop_kernel")
        self.assertEqual(s["loop"], {"label": ".L_x_2", "start": 0x05B0, "end": 0x0A90})
        self.assertEqual(s["loops"], 2)  # and the trap `.L_x_3: BRA .L_x_3` after EXIT
        self.assertEqual((s["hmma"], s["instructions"], s["instr_per_hmma"]), (8, 76, 9.5))
        self.assertEqual((s["smem_read_bytes"], s["smem_read_per_hmma"]), (3072, 384.0))
        self.assertEqual((s["smem_write_bytes"], s["smem_write_per_hmma"]), (0, 0.0))
        self.assertEqual((s["ldgsts_bytes"], s["ldgsts_per_hmma"]), (1536, 192.0))
        self.assertEqual((s["bar"], s["mufu"], s["mufu_kinds"]), (2, 4, {"EX2": 4}))
        self.assertEqual((s["divmod"], s["divmod_function"]), (0, 1))

    def test_innermost_loop_on_a_tie(self):
        s = sass_stats.analyze_sass(NESTED, "fusor_fused")  # found by its mangled name
        self.assertEqual(s["function"], "_Z11fusor_fusedPKfPf")
        self.assertEqual(s["loop"]["label"], ".L_x_1")
        # LDSM, HMMA, HMMA, BRA (the NOP left out)
        self.assertEqual((s["hmma"], s["instructions"], s["instr_per_hmma"]), (2, 4, 2.0))
        self.assertEqual((s["smem_read_per_hmma"], s["smem_write_per_hmma"], s["bar"]), (256.0, 0.0, 0))

    def test_outer_loop_with_more_hmma(self):
        text = NESTED.replace("STS.U16 [R2], R0", "HMMA.16816.F32 R20, R4, R8, R20")
        s = sass_stats.analyze_sass(text)
        self.assertEqual(s["loop"]["label"], ".L_x_0")
        # LDS.128 (512 B), LDSM.4 (512 B), 3 HMMA, 2 BRA, BAR
        self.assertEqual((s["hmma"], s["instructions"], s["instr_per_hmma"]), (3, 8, 2.67))
        self.assertEqual((s["smem_read_bytes"], s["smem_read_per_hmma"], s["bar"]), (1024, 341.33, 1))

    def test_no_loop_and_divmod(self):
        s = sass_stats.analyze_sass(DIVMOD)
        self.assertEqual(s["function"], "k")  # the subroutine is a function of its own
        self.assertIsNone(s["loop"])  # the loop has no HMMA: the whole function
        self.assertEqual((s["hmma"], s["instructions"], s["instr_per_hmma"]), (2, 10, 5.0))
        self.assertEqual((s["mufu"], s["mufu_kinds"]), (3, {"RCP": 2, "EX2": 1}))
        # I2F.U32.RP and the call to the 64-bit rem; not the float division's slow path
        self.assertEqual((s["divmod"], s["divmod_function"]), (2, 2))

    def test_shared_bytes_per_warp(self):
        cases = {"LDS.U8": (32, 0, 0), "LDS.S16": (64, 0, 0), "LDS": (128, 0, 0), "LDS.64": (256, 0, 0),
                 "LDS.U.128": (512, 0, 0), "LDSM.16.MT88": (128, 0, 0), "LDSM.16.M88.2": (256, 0, 0),
                 "STS.U16": (0, 64, 0), "STS.128": (0, 512, 0), "STSM.16.M88.4": (0, 512, 0),
                 "LDGSTS.E.BYPASS.128": (0, 0, 512), "LDGSTS.E.64": (0, 0, 256), "LDGSTS.E": (0, 0, 128),
                 "LDG.E.128": (0, 0, 0)}
        for opcode, want in cases.items():
            self.assertEqual(sass_stats.shared_bytes(opcode), want, opcode)


class OccupancyTest(unittest.TestCase):
    def test_sm90(self):
        cases = [  # threads, registers, shared bytes -> blocks/SM, limiter
            ((128, 168, 135168), (1, "shared memory")),  # 136192 B each of 233472; registers allow 3
            ((128, 64, 0), (8, "registers")),  # 2048 regs/warp: 8 warps per 16384-register sub-partition
            ((256, 255, 0), (1, "registers")),  # 256 x 32 = 8192 regs/warp: 8 warps
            ((32, 80, 0), (24, "registers")),  # 2560 regs/warp: 6 per sub-partition, 24 (not 65536/2560 = 25)
            ((128, 40, 6144), (12, "registers")),  # 1280 regs/warp: 12 per sub-partition, 48 warps
            ((128, 32, 49152), (4, "shared memory")),  # 50176 B each
            ((256, 32, 0), (8, "warps")),  # 64 warps / 8
            ((32, 16, 0), (32, "blocks")),
            ((1024, 65, 0), (0, "registers")),  # 72 x 32 x 32 warps > 65536
            ((128, 32, 232448), (1, "shared memory")),  # the 227 KB opt-in maximum
            ((128, 32, 232449), (0, "shared memory")),
        ]
        for args, want in cases:
            self.assertEqual(sass_stats.occupancy(*args), want, args)


class CommandLineTest(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)

    def test_missing_nvdisasm(self):
        with tempfile.TemporaryDirectory() as d:
            run = self.run_script(d, "--nvdisasm", Path(d) / "nvdisasm")
        self.assertEqual(run.returncode, 2)
        self.assertIn("pip install nvidia-cuda-nvdisasm", run.stderr)

    def test_end_to_end(self):
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not os.access(nvcc, os.X_OK) or not sass_stats.find_nvdisasm():
            self.skipTest("needs nvcc and nvdisasm (pip install nvidia-cuda-nvdisasm)")
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-o", d / "k.cubin", DATA / "sass_loop_sm90.cu"],
                           check=True)
            meta = {"chain": "test_chain", "label": "loop", "kernel": "loop_kernel", "arch": "sm_90", "sm_count": 132,
                    "grid": 2000, "threads": 128, "dynamic_shared_bytes": 0, "registers": 40, "spill_store_bytes": 0,
                    "spill_load_bytes": 0, "static_shared_bytes": 6144}
            (d / "k.json").write_text(json.dumps(meta))
            run = self.run_script(d, "--json", d / "out.json")
            self.assertEqual(run.returncode, 0, run.stderr)
            row = json.loads((d / "out.json").read_text())[0]
        self.assertIn("| test_chain | loop | 40 | 0/0 | 6.0 | 12 (registers) | 2000 | 15.15 | 1.26 |", run.stdout)
        self.assertEqual(row["sass"]["smem_read_per_hmma"], 384.0)  # set by the source, whatever the compiler
        self.assertEqual((row["sass"]["bar"], row["sass"]["mufu"]), (2, 4))


if __name__ == "__main__":
    unittest.main()
