"""Fixtures: the repository, the built fusor binaries, and a real scheduler and worker on loopback."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fusor

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FUSOR_BUILD_DIR", REPO / "build"))

# Small chains, so that tuning them takes seconds.
ATTENTION = """
chain small_attention
dtype f32
dim b=2 m=32 n=48 k=16 h=24
in  Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.25
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
"""

FFN = """
chain small_ffn
dtype f32
dim m=16 c=32 f=64 o=24
in  X[m,c] W1[c,f] B1[f] W2[f,o]
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = gelu(H[m,f] + B1[f])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
"""


def attention_reference(q, k, v, scale, mask=None):
    s = np.einsum("...mk,...nk->...mn", q.astype(np.float64), k.astype(np.float64)) * scale
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v.astype(np.float64)


def ffn_reference(x, w1, b1, w2):
    """FFN's Y = gelu(X W1 + B1) W2 (the exact, erf GELU) in float64."""
    from math import erf, sqrt

    h = x.astype(np.float64) @ w1 + b1
    return (h * 0.5 * (1 + np.vectorize(erf)(h / sqrt(2)))) @ w2


# Scheduler flags for tests: short timing, no candidate refused as noisy, and the fused kernel as the answer
# even where the unfused chain measured faster (these small kernels take microseconds on a shared machine; the
# tests check results, not timings; test_client.py checks an unfused answer).
TEST_SCHEDULER = ["--budget", "2", "--time-budget", "0.05", "--max-spread", "100", "--fused-only"]


def binary(name: str) -> Path:
    for sub in ("server", "worker", "client"):
        if (BUILD / sub / name).exists():
            return BUILD / sub / name
    pytest.fail(f"{name} is not built under {BUILD} (build fusor first, or set FUSOR_BUILD_DIR)")


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """A scheduler with one CPU worker, started once for the session (the embedded service's processes)."""
    svc = fusor.EmbeddedService(bin_dir=BUILD, calibration_seconds=0.05, scheduler_args=TEST_SCHEDULER)
    with fusor.Client(svc.address, timeout=30) as c:
        svc.wait_for_worker(c.workers)
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def client(service, tmp_path_factory):
    c = fusor.Client(service.address, timeout=300, cache_dir=tmp_path_factory.mktemp("kernels"))
    yield c
    c.close()


def start_scheduler(directory, *args, timeout=60):
    """A fusor-scheduler on a free loopback port with `args`; (process, port). Its output goes to a file."""
    log = Path(directory) / "scheduler.out"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(binary("fusor-scheduler")), "--listen", "127.0.0.1:0", *args],
                                   stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(r"listening on port (\d+)", log.read_text(errors="replace"))
        if found:
            return process, int(found.group(1))
        time.sleep(0.02)
    process.kill()
    pytest.fail(f"fusor-scheduler did not start:\n{log.read_text(errors='replace')}")


def run_python(*args, cwd=REPO, env=None, timeout=300):
    """Runs this interpreter on args; returns the completed process (stdout and stderr as text)."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
