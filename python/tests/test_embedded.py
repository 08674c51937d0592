"""The embedded mode: a private scheduler and worker started and stopped by the client."""

import numpy as np
import pytest

import fusor

from conftest import ATTENTION, BUILD, TEST_SCHEDULER, attention_reference


def test_embedded_tunes_and_stops_its_processes_and_files(tmp_path):
    with fusor.Client.embedded(bin_dir=BUILD, calibration_seconds=0.05, cache_dir=tmp_path,
                               scheduler_args=TEST_SCHEDULER) as client:
        service = client._embedded
        processes = list(service._processes)
        assert service.address.startswith("127.0.0.1:") and service.db.parent == service.directory
        assert all(p.poll() is None for p in processes)
        kernel = client.compile(ATTENTION, budget=2)
        q, k, v = (np.random.default_rng(3).random(s.shape, dtype=np.float32) for s in kernel.inputs)
        np.testing.assert_allclose(kernel(q, k, v), attention_reference(q, k, v, 0.25), rtol=1e-4, atol=1e-5)
        directory = service.directory
    assert all(p.poll() is not None for p in processes)
    assert not directory.exists()


def test_a_kept_database_outlives_the_service_and_answers_the_next(tmp_path):
    db = tmp_path / "kept.db"
    with fusor.Client.embedded(db, bin_dir=BUILD, calibration_seconds=0.05, scheduler_args=TEST_SCHEDULER) as client:
        first = client.tune(ATTENTION, budget=2)
    assert db.exists()
    with fusor.Client.embedded(db, bin_dir=BUILD, calibration_seconds=0.05, scheduler_args=TEST_SCHEDULER) as client:
        again = client.lookup(ATTENTION)
    assert again is not None and again.workload_key == first.workload_key


def test_missing_binaries_and_failing_starts_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(fusor.EmbeddedError, match="fusor-nothing not found .* FUSOR_BIN_DIR"):
        fusor.find_binary("fusor-nothing", tmp_path)
    # A scheduler that cannot open its database: the error carries its log.
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(fusor.EmbeddedError, match="fusor-scheduler exited with"):
        fusor.EmbeddedService(db=tmp_path / "dir.db", bin_dir=BUILD)
    # A worker that cannot start (an unknown flag): the error carries its log, nothing is left running.
    with pytest.raises(fusor.EmbeddedError, match="(?s)fusor-worker exited with .*--no-such-flag"):
        fusor.Client.embedded(bin_dir=BUILD, worker_args=["--no-such-flag"])


def test_bin_dir_then_fusor_bin_dir_come_before_the_source_tree(tmp_path, monkeypatch):
    own = tmp_path / "fusor-worker"
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755)
    monkeypatch.setenv("FUSOR_BIN_DIR", str(tmp_path))
    assert fusor.find_binary("fusor-worker") == own.resolve()
    assert fusor.find_binary("fusor-worker", bin_dir=BUILD) == (BUILD / "worker" / "fusor-worker").resolve()
    monkeypatch.delenv("FUSOR_BIN_DIR")
    monkeypatch.setenv("PATH", str(tmp_path))
    # Installed from this source tree: its build/ comes before PATH.
    assert fusor.find_binary("fusor-worker") == (BUILD / "worker" / "fusor-worker").resolve()


def test_request_counters_read_as_the_worker_reads_them(tmp_path):
    import struct
    import threading

    from fusor._quiet import Requests

    counters = Requests(tmp_path / "requests")

    def read():
        return struct.unpack("=QQ", (tmp_path / "requests").read_bytes())

    with counters.aside():  # outside a request: nothing changes
        assert read() == (0, 0)
    with counters:
        assert read() == (1, 1)
        seen = []

        def elsewhere():  # another thread, in no request of its own
            with counters.aside():
                seen.append(read())

        other = threading.Thread(target=elsewhere)
        other.start()
        other.join()
        assert seen == [(1, 1)]
        with counters.aside():  # waiting for the worker: not running
            assert read() == (0, 1)
        assert read() == (1, 2)  # resumed: a request starting
    assert read() == (0, 2)
