"""A private scheduler and worker for use without a server.

The embedded service runs the built fusor-scheduler and fusor-worker
binaries as child processes: the scheduler on a free loopback port with a
private database (unless ``db=`` names one to keep), and one worker dialling
it. Both stop when the service is closed or the Python process exits, and,
on Linux, when it dies (the children are started by a thread that lives as
long as the process, with a parent-death signal).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Set, Union

from ._errors import EmbeddedError
from ._quiet import Requests

_PORT_LINE = re.compile(r"listening on port (\d+)")
_PR_SET_PDEATHSIG = 1

_prctl: Optional[Any]
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it
except (OSError, AttributeError):
    _prctl = None

# The thread that starts the children. A parent-death signal fires when the
# thread that forked the child exits, so it must outlive every service: an
# executor's thread waits for work until the interpreter shuts down.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fusor-embedded")


def _search_dirs(bin_dir: Optional[Union[str, os.PathLike]]) -> List[Path]:
    dirs: List[Path] = []
    if bin_dir:
        dirs.append(Path(bin_dir))
    if os.environ.get("FUSOR_BIN_DIR"):
        dirs.append(Path(os.environ["FUSOR_BIN_DIR"]))
    recorded = Path(__file__).resolve().parent / "_source_tree.txt"
    if recorded.exists():
        dirs.append(Path(recorded.read_text().strip()) / "build")
    dirs += [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    return dirs


def find_binary(name: str, bin_dir: Optional[Union[str, os.PathLike]] = None) -> Path:
    """The absolute path of `name`, looked for in bin_dir, $FUSOR_BIN_DIR, the build/ of the source tree the
    package was installed from, then PATH (a CMake build tree is searched in its server/, worker/ and client/)."""
    for d in _search_dirs(bin_dir):
        for candidate in (d / name, d / "server" / name, d / "worker" / name, d / "client" / name):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate.resolve()
    raise EmbeddedError(f"{name} not found (looked in bin_dir, $FUSOR_BIN_DIR, the source tree's build/ and PATH); "
                        "build fusor (./deploy/build.sh), or set FUSOR_BIN_DIR to the directory of its binaries")


def lowest_priority() -> None:
    """This process runs only when nothing else wants its cores: SCHED_IDLE, which the scheduler preempts at
    once for any other task (a nice value alone still lets it hold a core for milliseconds after a request's
    threads wake up); nice 19 where SCHED_IDLE is refused."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def _child_setup(parent: int, idle: bool = False, cores: Optional[Set[int]] = None) -> Callable[[], None]:
    def setup() -> None:
        # SIGTERM when the spawning thread (which lives as long as the process) goes away; and if the
        # parent is already gone, do not start at all.
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        if idle:
            lowest_priority()  # the child's children (compilers, measurement runners) inherit it
        if cores:
            os.sched_setaffinity(0, cores)

    return setup


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EmbeddedService:
    """A fusor-scheduler and a fusor-worker running as children of this process.

    Args:
        db: tuning database to use and keep; default a private one, deleted on close.
        bin_dir: where fusor-scheduler and fusor-worker are (see :func:`find_binary`).
        backend: the worker's backend: "cpu", "cuda" or "auto".
        calibration_seconds: the worker's calibration run length (0 skips it).
        startup_timeout: seconds to wait for the scheduler's port and the worker's registration.
        scheduler_args, worker_args: extra command-line flags.
        serving: this process serves requests on the machine the worker tunes on (fusor.torch): the worker runs
            at the lowest CPU priority (SCHED_IDLE: it takes only what the requests leave; the scheduler too) and
            times kernels between
            the requests counted in :attr:`requests` (``with service.requests:`` around each); its jobs are held
            while a request runs (compiling, validating, timing: nothing taken from the requests), unless
            ``worker_cores`` gives it that many cores of its own (its kernels are then tuned for that many).
        worker_cores: the cores the worker may use (None: all).
    """

    def __init__(self, db: Optional[Union[str, os.PathLike]] = None, bin_dir: Optional[Union[str, os.PathLike]] = None,
                 backend: str = "cpu", calibration_seconds: Optional[float] = None, startup_timeout: float = 120.0,
                 scheduler_args: Sequence[str] = (), worker_args: Sequence[str] = (), serving: bool = False,
                 worker_cores: Optional[int] = None):
        scheduler_bin = find_binary("fusor-scheduler", bin_dir)
        worker_bin = find_binary("fusor-worker", bin_dir)
        self.directory = Path(tempfile.mkdtemp(prefix="fusor-embedded-"))
        self.db = Path(db).expanduser().resolve() if db else self.directory / "tuning.db"
        self.startup_timeout = startup_timeout
        self._processes: List[subprocess.Popen] = []
        self._finalizer = weakref.finalize(self, EmbeddedService._stop, self._processes, self.directory)
        self.requests: Optional[Requests] = None
        try:
            self.scheduler_log = self.directory / "scheduler.log"
            # Serving, the scheduler too takes only idle cycles (building a task's space takes up to a second).
            self._start([str(scheduler_bin), "--listen", "127.0.0.1:0", "--db", str(self.db), "--insecure",
                         *scheduler_args], self.scheduler_log, idle=serving)
            self.port = self._wait_for_port()
            self.address = f"127.0.0.1:{self.port}"
            self.worker_log = self.directory / "worker.log"
            worker = [str(worker_bin), "--scheduler", self.address, "--backend", backend, "--name",
                      f"embedded-{os.getpid()}", "--scratch-dir", str(self.directory)]
            if calibration_seconds is not None:
                worker += ["--calibration-seconds", str(calibration_seconds)]
            if serving:
                self.requests = Requests(self.directory / "requests")
                worker += ["--quiet-file", str(self.requests.path)]
                # Without cores of its own, the worker's jobs wait while a request runs.
                if worker_cores is None:
                    worker.append("--hold-during-requests")
            cores = None
            if worker_cores is not None:
                available = sorted(os.sched_getaffinity(0))
                if not 1 <= worker_cores <= len(available):
                    raise EmbeddedError(f"worker_cores={worker_cores}: this process may use {len(available)} cores")
                cores = set(available[-worker_cores:])  # the last ones: the serving threads start on the first
            self._start([*worker, *worker_args], self.worker_log, idle=serving, cores=cores)
        except BaseException:
            self.close()
            raise

    def _start(self, argv: List[str], log: Path, idle: bool = False, cores: Optional[Set[int]] = None) -> None:
        with open(log, "wb") as out:
            # A session of its own: stopping the service signals the child's own children too.
            process = _spawner.submit(subprocess.Popen, argv, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, cwd=self.directory, start_new_session=True,
                                      preexec_fn=_child_setup(os.getpid(), idle, cores)).result()
        self._processes.append(process)

    def _wait_for_port(self) -> int:
        scheduler = self._processes[0]
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            found = _PORT_LINE.search(self.scheduler_log.read_text(errors="replace"))
            if found:
                return int(found.group(1))
            if scheduler.poll() is not None:
                raise EmbeddedError(f"fusor-scheduler exited with {scheduler.returncode}:\n{_tail(self.scheduler_log)}")
            time.sleep(0.02)
        raise EmbeddedError(f"fusor-scheduler did not report its port in {self.startup_timeout:.0f} s:\n"
                            f"{_tail(self.scheduler_log)}")

    def wait_for_worker(self, list_workers: Callable[[], list]) -> None:
        """Waits until the worker has registered (calibration included), or fails with its log."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if any(w.state == "alive" for w in list_workers()):
                return
            for p, name, log in zip(self._processes, ("fusor-scheduler", "fusor-worker"),
                                    (self.scheduler_log, self.worker_log)):
                if p.poll() is not None:
                    raise EmbeddedError(f"{name} exited with {p.returncode}:\n{_tail(log)}")
            time.sleep(0.05)
        raise EmbeddedError(f"the embedded worker did not register in {self.startup_timeout:.0f} s:\n"
                            f"{_tail(self.worker_log)}")

    def close(self) -> None:
        """Stops the worker, then the scheduler (SIGTERM to each one's process group, SIGKILL after 10 s), and
        removes the private files."""
        self._finalizer()

    @staticmethod
    def _stop(processes: List[subprocess.Popen], directory: Path) -> None:
        def signal_group(p: subprocess.Popen, sig: int) -> None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

        for p in reversed(processes):
            signal_group(p, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                signal_group(p, signal.SIGKILL)
                p.wait()
        processes.clear()
        shutil.rmtree(directory, ignore_errors=True)
