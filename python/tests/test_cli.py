"""python -m fusor through a scheduler."""

from conftest import ATTENTION, REPO, run_python


def test_help_lists_the_main_commands():
    proc = run_python("-m", "fusor", "--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("tune", "compile", "lookup", "workers", "task", "sweep"):
        assert command in proc.stdout


def test_commands_through_a_server(service, tmp_path):
    chain = tmp_path / "attention.fusor"
    # (another scale: another chain, not the session's attention at other sizes, which a lookup would answer by
    # carrying its schedule over)
    chain.write_text(ATTENTION.replace("* 0.25", "* 0.35"))
    server = ["-m", "fusor", "--server", service.address]

    miss = run_python(*server, "lookup", str(chain))
    assert miss.returncode == 3 and "not in the cache" in miss.stderr

    tuned = run_python(*server, "tune", "--budget", "2", str(chain))
    assert tuned.returncode == 0, tuned.stderr
    assert "tuned now by task" in tuned.stdout and "measured" in tuned.stderr
    task_id = tuned.stdout.split("tuned now by task ")[1].split(":")[0]

    assert "from the cache" in run_python(*server, "lookup", str(chain)).stdout
    task = run_python(*server, "task", task_id)
    assert task.returncode == 0 and "(done)" in task.stdout

    out = tmp_path / "out"
    compiled = run_python(*server, "compile", "--cache-only", "-o", str(out), str(chain))
    assert compiled.returncode == 0, compiled.stderr
    assert "int fusor_run(" in (out / "attention.cc").read_text()
    assert '"workload_key"' in (out / "attention.json").read_text()

    assert "alive" in run_python(*server, "workers").stdout

    bad = tmp_path / "bad.fusor"
    bad.write_text("chain c\ndtype f64\n")
    failed = run_python(*server, "tune", str(bad))
    assert failed.returncode == 1 and "INVALID_ARGUMENT" in failed.stderr and "f64" in failed.stderr

    unreachable = run_python("-m", "fusor", "--server", "127.0.0.1:1", "--timeout", "3", "workers")
    assert unreachable.returncode == 1 and "UNAVAILABLE" in unreachable.stderr


def test_sweep_of_chain_files(service):
    files = [str(REPO / "examples" / "operators" / "gemv.fusor")]
    proc = run_python("-m", "fusor", "--server", service.address, "sweep", "--budget", "2", *files)
    assert proc.returncode == 0, proc.stderr
    assert "gemv" in proc.stdout and "(done)" in proc.stdout


def test_embedded_mode_needs_no_server(tmp_path):
    db = tmp_path / "cli.db"
    proc = run_python("-m", "fusor", "--embedded", "--db", str(db), "workers")
    assert proc.returncode == 0, proc.stderr
    assert "alive" in proc.stdout and db.exists()
