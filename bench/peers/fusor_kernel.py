"""Builds and loads a kernel `fusor compile` wrote, as fusor's workers do: the
source compiled with the flags and libraries in its metadata, the entry point
(and, where the kernel packs constants, fusor_prepare and fusor_run_prepared)
typed for ctypes. Shared by peers.py and attention_memory.py."""

import ctypes
import json
import os
import shlex
import subprocess


def run_cmd(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(shlex.quote(c) for c in cmd), r.returncode,
                                                     r.stdout[-3000:], r.stderr[-3000:]))
    return r.stdout


def build_kernel(out, compiler="c++"):
    """Builds the kernel `fusor compile` wrote into `out` with its recorded flags; (entry point, metadata)."""
    source = [f for f in os.listdir(out) if f.endswith(".cc")][0]
    meta = json.load(open(os.path.join(out, source[:-3] + ".json")))
    kmeta = meta.get("kernel", meta)
    so = os.path.join(out, "kernel.so")
    libs = ["-l" + l for l in kmeta.get("link_libs", meta.get("link_libs", []))]
    run_cmd([compiler] + kmeta["compile_flags"] + ["-shared", "-fPIC", "-o", so, os.path.join(out, source)] + libs)
    lib = ctypes.CDLL(so)
    fn = lib[kmeta.get("entry_point", "fusor_run")]
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    fn.restype = ctypes.c_int
    if kmeta.get("prepare"):
        # The constant inputs packed once (fusor_prepare), then every call prepared: as a model runs it.
        lib.fusor_prepare.argtypes, lib.fusor_prepare.restype = [ctypes.POINTER(ctypes.c_void_p)], ctypes.c_void_p
        lib.fusor_run_prepared.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.fusor_run_prepared.restype = ctypes.c_int
        fn.prepare, fn.run_prepared = lib.fusor_prepare, lib.fusor_run_prepared
    return fn, meta
