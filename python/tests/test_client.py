"""The client against a real scheduler and CPU worker on loopback."""

import ctypes
import json
import os
import subprocess
import threading
import time
from timeit import timeit

import grpc
import numpy as np
import pytest

import fusor
import fusor._kernel
from fusor import Chain, ChainBuilder
from fusor._errors import from_grpc

from conftest import (ATTENTION, BUILD, FFN, REPO, TEST_SCHEDULER, attention_reference, binary, ffn_reference,
                      start_scheduler)


def test_tune_streams_progress_then_answers_from_the_cache(client):
    events = []
    result = client.tune(ATTENTION, budget=2, force=True, progress=events.append)
    assert isinstance(events[0], fusor.Started) and events[0].budget == 2
    assert any(isinstance(e, fusor.Progress) for e in events)
    assert not result.from_cache and result.candidates_measured == 2
    assert len(result.workload_key) == 32 and result.best_s > 0 and result.schedule
    assert result.target.arch and result.target.fingerprint.startswith("cpu-")
    assert "measured" in str(result)

    # The same chain renamed is the same workload: a cache hit, as text and built in Python.
    renamed = ATTENTION.replace("small_attention", "renamed").replace("Q", "A")
    events = list(client.tune_events(renamed))
    assert len(events) == 1 and events[0].from_cache
    assert events[0].workload_key == result.workload_key
    built = (ChainBuilder("built").dim(b=2, m=32, n=48, k=16, h=24)
             .input("A", "b", "m", "k").input("K", "b", "n", "k").input("V", "b", "n", "h")
             .sum("S[b,m,n]", "k", "A[b,m,k] * K[b,n,k] * 0.25").softmax("P[b,m,n]", "n", "S[b,m,n]")
             .sum("O[b,m,h]", "n", "P[b,m,n] * V[b,n,h]").output("O"))
    hit = client.lookup(built)
    assert hit.workload_key == result.workload_key and hit.schedule == result.schedule

    task = client.task(result.task_id)
    assert task.state == "done" and task.result.workload_key == result.workload_key
    assert task.progress.measured == 2


def test_lookup_misses_and_cache_only_compiles_are_not_found(client):
    assert client.lookup(ATTENTION.replace("* 0.25", "* 0.3")) is None  # no record of this chain at any size
    # The same chain at another size: the nearest record's schedule, not yet measured here.
    client.tune(ATTENTION, budget=2)
    fresh = ATTENTION.replace("n=48", "n=40")
    transferred = client.lookup(fresh)
    assert transferred is not None and transferred.answer == "transferred" and not transferred.validated
    assert transferred.source_key == client.lookup(ATTENTION).workload_key and transferred.best_s == 0
    # A kernel answers only once it is validated at these sizes.
    with pytest.raises(fusor.NotFoundError) as e:
        client.compile(fresh, cache_only=True)
    assert e.value.code == grpc.StatusCode.NOT_FOUND and e.value.retry_after is None
    with pytest.raises(fusor.NotFoundError):
        client.task("t-0000000000000000")


def test_a_wrong_chain_is_invalid_argument_with_the_line(client):
    wrong = ATTENTION.replace("* V[b,n,h]", "* W[b,n,h]")
    with pytest.raises(fusor.InvalidArgumentError) as e:
        client.tune(wrong)
    assert "W" in e.value.details and e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_workers_lists_the_registered_worker(client):
    workers = client.workers()
    assert [w.state for w in workers] == ["alive"]
    assert workers[0].target_fingerprint.startswith("cpu-") and workers[0].arch


def test_a_kernel_runs_on_numpy_and_matches_a_numpy_reference(client):
    kernel = client.compile(ATTENTION, budget=2)
    assert [s.name for s in kernel.inputs] == ["Q", "K", "V"] and kernel.outputs[0].shape == (2, 32, 24)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s.shape, dtype=np.float32) for s in kernel.inputs)
    out = kernel(q, k, v)
    assert out.dtype == np.float32 and out.shape == (2, 32, 24)
    np.testing.assert_allclose(out, attention_reference(q, k, v, 0.25), rtol=1e-4, atol=1e-5)

    given = np.full((2, 32, 24), np.nan, dtype=np.float32)
    assert kernel(q, k, v, out=given, num_threads=1) is given
    np.testing.assert_allclose(given, out, rtol=1e-5, atol=1e-6)

    # Built once: a second compile loads the same shared object from the cache directory.
    library = kernel.library_path
    inode = library.stat().st_ino
    again = client.compile(ATTENTION)
    assert again.library_path == library and library.stat().st_ino == inode  # a build would replace the file
    assert library.parent.name == f"{kernel.workload_key}-{kernel.result.target.fingerprint}"


def test_a_gemm_chain_with_bias_and_gelu(client):
    kernel = client.compile(FFN, budget=2)
    rng = np.random.default_rng(2)
    x, w1, b1, w2 = (rng.standard_normal(s.shape, dtype=np.float32) for s in kernel.inputs)
    np.testing.assert_allclose(kernel(x, w1, b1, w2), ffn_reference(x, w1, b1, w2), rtol=1e-4, atol=1e-4)


def test_wrong_arguments_are_refused_before_the_call(client):
    kernel = client.compile(ATTENTION, budget=2)
    q, k, v = (np.zeros(s.shape, dtype=np.float32) for s in kernel.inputs)
    cases = [
        ((q, k), {}, "kernel 'small_attention' takes 3 inputs \\(Q, K, V\\), got 2"),
        ((q, k, v.astype(np.float64)), {}, "input V must be float32 \\(f32\\), got float64"),
        ((q, k, v[:, :, :12]), {}, "input V must have shape \\(2, 48, 24\\), got \\(2, 48, 12\\)"),
        ((q, k, np.zeros((2, 24, 48), np.float32).transpose(0, 2, 1)), {}, "input V must be C-contiguous"),
        ((q, k, v.tolist()), {}, "input V must be a NumPy array or a PyTorch CPU tensor, got list"),
        ((q, k, v), {"out": (np.zeros((2, 32, 24), np.float32),) * 2}, "writes 1 outputs \\(O\\), out= has 2"),
        ((q, k, v), {"out": np.zeros((2, 32, 24), np.float16)}, "output O must be float32"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(fusor.KernelArgumentError, match=message):
            kernel(*args, **kwargs)
    frozen = np.zeros((2, 32, 24), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(fusor.KernelArgumentError, match="read-only"):
        kernel(q, k, v, out=frozen)


def test_the_call_releases_the_gil(client):
    kernel = client.compile(FFN.replace("m=16", "m=1024").replace("c=32", "c=512").replace("f=64", "f=1024"), budget=2)
    # ctypes releases the GIL around calls of a CDLL's functions, not of a PyDLL's.
    assert not kernel._fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    args = [np.ones(s.shape, dtype=np.float32) for s in kernel.inputs]
    kernel(*args, num_threads=1)
    one_call = min(timeit(lambda: kernel(*args, num_threads=1), number=1) for _ in range(3))
    if one_call < 0.003:
        pytest.skip(f"one call takes {one_call * 1e3:.1f} ms: too short to see the GIL in")
    calls = 5
    thread = threading.Thread(target=lambda: [kernel(*args, num_threads=1) for _ in range(calls)])
    stalled = 0.0
    last = time.perf_counter()
    thread.start()
    while thread.is_alive():
        now = time.perf_counter()
        if now - last > 0.001:
            stalled += now - last
        last = now
    thread.join()
    # Holding the GIL through each call would stall this loop for about `calls` calls; a preempted loop on a
    # busy machine stalls for a fraction of that.
    assert stalled < calls * one_call / 2, (stalled, one_call)


def test_a_kernel_tuned_for_features_this_cpu_lacks_is_refused(client):
    response = client.compile_source(ATTENTION, budget=2)
    response.result.target.isa_features.append("avx9000")
    with pytest.raises(fusor.BuildError, match="uses avx9000, which this CPU lacks"):
        fusor.CpuKernel(response)


def test_a_source_that_does_not_build_says_what_the_compiler_said(client, tmp_path):
    response = client.compile_source(ATTENTION, budget=2)
    response.kernel_source += "\nthis is not C++;\n"
    with pytest.raises(fusor.BuildError, match="building the kernel failed"):
        fusor.CpuKernel(response, cache_dir=tmp_path)
    with pytest.raises(fusor.BuildError, match="no C\\+\\+ compiler 'no-such-c\\+\\+'"):
        fusor.CpuKernel(response, cache_dir=tmp_path, compiler="no-such-c++")


@pytest.mark.parametrize("library", ["onednn", "openblas"])
def test_an_unfused_answer_builds_with_its_library_and_runs(client, tmp_path, library):
    """Where fusion does not pay, the answer is the unfused chain, calling the library it was measured with."""
    (tmp_path / "attention.fusor").write_text(ATTENTION)
    subprocess.run([str(binary("fusor")), "compile", "--unfused", library, "-o", str(tmp_path),
                    str(tmp_path / "attention.fusor")], check=True, capture_output=True)
    response = client.compile_source(ATTENTION, budget=2)
    response.kernel_source = (tmp_path / "attention.cc").read_text()
    response.metadata_json = (tmp_path / "attention.json").read_text()
    response.result.best.schedule.text = f"unfused {library}"
    kernel = fusor.CpuKernel(response, cache_dir=tmp_path)
    assert kernel.libs == [f"-l{'dnnl' if library == 'onednn' else 'openblas'}"]
    q, k, v = (np.random.default_rng(5).random(s.shape, dtype=np.float32) for s in kernel.inputs)
    np.testing.assert_allclose(kernel(q, k, v), attention_reference(q, k, v, 0.25), rtol=1e-4, atol=1e-5)
    assert fusor.Result.from_proto(response.result).unfused
    # No constants, no prepare step: prepare() still gives a callable.
    prepared = kernel.prepare()
    assert not prepared.packs
    np.testing.assert_allclose(prepared(q, k, v), attention_reference(q, k, v, 0.25), rtol=1e-4, atol=1e-5)


def test_a_split_answer_builds_with_its_library_prepares_and_runs(client, tmp_path):
    """The chain in two parts (GEMM, bias and GELU fused; the second GEMM through oneDNN) runs as any answer."""
    text = FFN.replace("W2[f,o]\n", "W2[f,o]\nconst W1 B1 W2\n", 1)
    (tmp_path / "ffn.fusor").write_text(text)
    split = "split after G: m=8 / - / H(c=16) | unfused onednn"
    subprocess.run([str(binary("fusor")), "compile", "--model-only", "--target", "local", "--schedule", split,
                    "-o", str(tmp_path), str(tmp_path / "ffn.fusor")], check=True, capture_output=True)
    response = client.compile_source(text, budget=2)  # a response to carry the split's kernel
    response.kernel_source = (tmp_path / "ffn.cc").read_text()
    response.metadata_json = json.dumps(json.loads((tmp_path / "ffn.json").read_text())["kernel"])
    response.result.best.schedule.text = split
    kernel = fusor.CpuKernel(response, cache_dir=tmp_path)
    assert kernel.libs == ["-ldnnl"]
    assert kernel.metadata["prepare"]["packs"] == ["W1 (B side of H)"]  # the fused head's; oneDNN packs its own
    x, w1, b1, w2 = (np.random.default_rng(4).random(s.shape, dtype=np.float32) for s in kernel.inputs)
    expected = ffn_reference(x, w1, b1, w2)
    np.testing.assert_allclose(kernel(x, w1, b1, w2), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(kernel.prepare(w1, b1, w2)(x), expected, rtol=1e-4, atol=1e-4)
    result = fusor.Result.from_proto(response.result)
    assert result.split and not result.unfused
    assert "split after G: the head fused, the tail unfused, through onednn" in str(result)


def test_constant_inputs_are_packed_once_by_prepare(tmp_path):
    """A chain's `const` inputs (a model's weights) are taken once by Kernel.prepare; the kernel packs them then."""
    text = FFN.replace("W2[f,o]\n", "W2[f,o]\nconst W1 B1 W2\n", 1)
    with fusor.Client.embedded(bin_dir=BUILD, calibration_seconds=0.05, cache_dir=tmp_path,
                               scheduler_args=TEST_SCHEDULER) as client:
        kernel = client.compile(text, budget=2)
    assert [s.name for s in kernel.constants] == ["W1", "B1", "W2"]
    assert kernel.metadata["prepare"]["packs"] == ["W1 (B side of H)", "W2 (B side of Y)"]
    x, w1, b1, w2 = (np.random.default_rng(9).random(s.shape, dtype=np.float32) for s in kernel.inputs)
    expected = kernel(x, w1, b1, w2)
    prepared = kernel.prepare(w1, b1, w2)
    assert prepared.packs and [s.name for s in prepared.inputs] == ["X"]
    np.testing.assert_allclose(prepared(x), expected, rtol=1e-6)
    out = np.empty_like(expected)
    prepared.run_pointers([x.ctypes.data], [out.ctypes.data])
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    with pytest.raises(fusor.KernelArgumentError, match="has 3 constant inputs \\(W1, B1, W2\\), got 1"):
        kernel.prepare(w1)
    with pytest.raises(fusor.KernelArgumentError, match="takes 1 inputs \\(X\\), got 2"):
        prepared(x, x)
    # Prepared on pointers (constants of every input, the others 0): run by pointers only, the arrays unknown.
    on_pointers = kernel.prepare_pointers([0, w1.ctypes.data, b1.ctypes.data, w2.ctypes.data])
    on_pointers.run_pointers([x.ctypes.data], [out.ctypes.data])
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    with pytest.raises(fusor.KernelArgumentError, match="was prepared on pointers: call run_pointers"):
        on_pointers(x)


def test_a_sweep_tunes_each_distinct_chain_once(client):
    client.tune(ATTENTION, budget=2)  # in the cache before the sweep
    other = ATTENTION.replace("m=32", "m=17")
    events = []
    report = client.sweep([fusor.SweepEntry(ATTENTION, model="a", role="attention"),
                           fusor.SweepEntry(Chain.parse(other), model="b"), ATTENTION], name="test", budget=2,
                          progress=events.append)
    assert report.state == "done" and [r.model for r in report.results] == ["a", "b", "small_attention"]
    assert report.results[0].state == "cache" and report.results[1].state == "tuned"
    assert report.results[1].best_s > 0
    assert client.get_sweep(report.sweep_id).sweep_id == report.sweep_id
    assert events, "no progress events"


def test_an_unreachable_scheduler_is_unavailable():
    with fusor.Client("127.0.0.1:1", timeout=5) as c, pytest.raises(fusor.UnavailableError) as e:
        c.workers()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_the_retry_hint_reaches_the_exception(client, tmp_path):
    # A scheduler that lets a client run one task at a time refuses a second with a retry hint.
    with fusor.Client.embedded(bin_dir=BUILD, calibration_seconds=0.05,
                               scheduler_args=[*TEST_SCHEDULER, "--max-tasks-per-client", "1"]) as c:
        started = threading.Event()

        def long_task():
            try:
                for event in c.tune_events(FFN.replace("m=16", "m=256"), budget=16):
                    if isinstance(event, fusor.Started):
                        started.set()
            except fusor.RpcError:
                pass  # cancelled when the service stops

        threading.Thread(target=long_task, daemon=True).start()
        assert started.wait(60), "the first task did not start"
        with pytest.raises(fusor.ResourceExhaustedError) as e:
            c.tune(ATTENTION.replace("m=32", "m=8"), budget=2)
        assert e.value.retry_after is not None and e.value.retry_after >= 1
        assert "at most 1" in e.value.details and e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_tokens_are_sent_and_refusals_are_auth_errors(tmp_path):
    db = tmp_path / "tokens.db"
    created = subprocess.run([str(binary("fusor")), "--db", str(db), "admin", "token", "create", "--role", "client",
                              "--name", "py"], capture_output=True, text=True, check=True, timeout=60)
    token = created.stdout.split()[0]
    scheduler, port = start_scheduler(tmp_path, "--db", str(db))
    try:
        with fusor.Client(f"127.0.0.1:{port}", token="", timeout=10) as anonymous, pytest.raises(fusor.AuthError) as e:
            anonymous.workers()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        with fusor.Client(f"127.0.0.1:{port}", token=token, timeout=10) as c:
            assert c.workers() == []
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=10)


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailers):
        self._code, self._details, self._trailers = code, details, trailers

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers


def test_grpc_errors_map_to_exceptions_with_their_hint():
    e = from_grpc(_FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", (("retry-after-ms", "1500"),)))
    assert isinstance(e, fusor.ResourceExhaustedError) and e.retry_after == 1.5 and "retry in 1.5 s" in str(e)
    e = from_grpc(_FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "wrong role", ()))
    assert isinstance(e, fusor.AuthError) and e.retry_after is None
    e = from_grpc(_FakeRpcError(grpc.StatusCode.INTERNAL, "boom", None))
    assert type(e) is fusor.RpcError and e.code == grpc.StatusCode.INTERNAL


def _bf16_bits(x):
    """float32 -> bfloat16 bits (round to nearest even), as uint16."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_kernels_take_float16_or_bfloat16_bits(client, dtype):
    chain = f"chain half_gemm_chain\ndtype {dtype}\ndim m=32 k=16 n=48 h=24\nin A[m,k] B[k,n] D[n,h]\n" \
            "C[m,n] = sum(k) A[m,k] * B[k,n]\nE[m,h] = sum(n) C[m,n] * D[n,h]\nout E\n"
    kernel = client.compile(chain, budget=2)
    rng = np.random.default_rng(4)
    values = [rng.uniform(-1, 1, s.shape).astype(np.float32) for s in kernel.inputs]
    if dtype == "f16":
        args = [v.astype(np.float16) for v in values]
        exact = [a.astype(np.float64) for a in args]
    else:
        args = [_bf16_bits(v) for v in values]
        exact = [_from_bf16_bits(a).astype(np.float64) for a in args]
        with pytest.raises(fusor.KernelArgumentError, match="must be uint16 \\(bf16\\), got float32"):
            kernel(*values)
    out = kernel(*args)
    got = out.astype(np.float64) if dtype == "f16" else _from_bf16_bits(out).astype(np.float64)
    reference = exact[0] @ exact[1] @ exact[2]
    # The intermediate C is stored in the chain's dtype: compare with the output's precision.
    np.testing.assert_allclose(got, reference, rtol=2e-2 if dtype == "bf16" else 4e-3,
                               atol=0.05 * np.abs(reference).max())


def test_mutual_tls_with_the_deployments_certificates(tmp_path):
    certs = tmp_path / "certs"
    subprocess.run([str(REPO / "deploy" / "make-certs.sh"), str(certs)], check=True, capture_output=True, timeout=60)
    scheduler, port = start_scheduler(tmp_path, "--db", str(tmp_path / "tls.db"), "--insecure",
                                      "--tls-cert", str(certs / "scheduler.pem"), "--tls-key",
                                      str(certs / "scheduler.key"), "--tls-client-ca", str(certs / "ca.pem"))
    try:
        address = f"127.0.0.1:{port}"
        with fusor.Client(address, tls=str(certs / "ca.pem"), tls_cert=str(certs / "client.pem"),
                          tls_key=str(certs / "client.key"), timeout=10) as c:
            assert c.workers() == []
        # Without a client certificate, or in plaintext, the scheduler cannot be reached.
        for kwargs in ({"tls": str(certs / "ca.pem")}, {}):
            with fusor.Client(address, timeout=5, **kwargs) as c, pytest.raises(fusor.UnavailableError):
                c.workers()
        with pytest.raises(fusor.FusorError, match="tls_cert and tls_key go together"):
            fusor.Client(address, tls_cert=str(certs / "client.pem"))
        with pytest.raises(fusor.FusorError, match="cannot read"):
            fusor.Client(address, tls=str(tmp_path / "missing.pem"))
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=10)


def test_the_kernel_cache_evicts_the_least_recently_used_beyond_its_size(client, tmp_path, monkeypatch):
    mib = 1 << 20
    old = []
    for i in range(3):
        path = tmp_path / f"workload{i}-cpu-x" / "fusor_run-0.so"
        path.parent.mkdir()
        path.write_bytes(b"\0" * mib)
        os.utime(path, (1000 + i, 1000 + i))
        old.append(path)
    monkeypatch.setattr(fusor._kernel, "CACHE_BYTES", 5 * mib // 2)
    kernel = fusor.CpuKernel(client.compile_source(ATTENTION, budget=2), cache_dir=tmp_path)
    assert kernel.library_path.stat().st_size < mib // 2
    # 3 MiB and the new kernel: the oldest goes, and what is left fits.
    assert [p.exists() for p in old] == [False, True, True] and kernel.library_path.exists()


def test_the_scheduler_answers_health_per_service_and_reflection(service):
    """grpc.health.v1 per service name, and server reflection (v1alpha, what grpcurl asks first), spoken as raw
    protobuf so that no fusor code is involved."""
    with grpc.insecure_channel(service.address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes,
                                    response_deserializer=bytes)
        name = b"fusor.v1.Scheduler"
        assert check(b"\x0a" + bytes([len(name)]) + name, timeout=10) == b"\x08\x01"  # status: SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            check(b"\x0a\x07nothing", timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        reflect = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                        request_serializer=bytes, response_deserializer=bytes)
        listed = list(reflect(iter([b"\x3a\x00"]), timeout=10))  # list_services (field 7)
    assert len(listed) == 1
    for service_name in (b"fusor.v1.Scheduler", b"fusor.v1.WorkerService", b"fusor.v1.Admin", b"grpc.health.v1.Health"):
        assert service_name in listed[0]
