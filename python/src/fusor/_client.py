"""The client of a fusor scheduler (fusor.v1.Scheduler over gRPC)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from ._chain import ChainLike, as_chain
from ._embedded import EmbeddedService
from ._errors import FusorError, NotFoundError, from_grpc
from ._kernel import CpuKernel, Kernel
from ._quiet import Requests
from ._result import Explanation, Progress, Result, Started, Task, Worker
from .v1 import scheduler_pb2, scheduler_pb2_grpc, target_pb2

Event = Union[Started, Progress, Result]
_BACKENDS = {"cpu": target_pb2.BACKEND_CPU, "cuda": target_pb2.BACKEND_CUDA}
_MAX_MESSAGE = 256 << 20
# A scheduler shutting down or restarting answers UNAVAILABLE; its tasks resume from the database and a call asked
# again joins its task. Such calls are asked again, the backoff doubling from 0.2 s to at most 5 s, for a minute.
_RETRY_SECONDS = 60.0
log = logging.getLogger("fusor")


class _Backoff:
    """Whether a failed call is asked again (UNAVAILABLE but for a failed TLS handshake, within the minute), after
    sleeping its backoff."""

    def __init__(self, enabled: bool):
        self.enabled, self.delay, self.waited = enabled, 0.2, 0.0

    def again(self, error: grpc.RpcError) -> bool:
        if not self.enabled or error.code() != grpc.StatusCode.UNAVAILABLE or self.waited + self.delay > _RETRY_SECONDS:
            return False
        if "handshake" in (error.details() or "").lower():  # a TLS setting to fix, not a restart
            return False
        log.warning("fusor: the scheduler is unavailable (%s); asking again in %.1f s", error.details(), self.delay)
        time.sleep(self.delay)
        self.waited += self.delay
        self.delay = min(2 * self.delay, 5.0)
        return True


@dataclass
class SweepEntry:
    """One chain of a sweep, with where it comes from in a model (all but the chain optional)."""

    chain: ChainLike
    model: str = ""
    role: str = ""
    source: str = ""
    instances: int = 1


class Client:
    """A connection to a fusor scheduler.

    Args:
        address: the scheduler's host:port.
        token: a client-role token (default: $FUSOR_TOKEN); none for a scheduler run with --insecure.
        tls: False for plaintext; True to verify the scheduler against the system's roots; or the path of
            the PEM CA certificate that signed the scheduler's.
        tls_cert, tls_key: PEM certificate and key of this side, for a scheduler that requires mutual TLS.
        tls_server_name: the name to verify in the scheduler's certificate when it differs from the host.
        timeout: seconds a call may take (tuning included).
        cache_dir: where CPU kernels are built (default :func:`fusor.default_cache_dir`).

    Use :meth:`embedded` to run a private scheduler and worker instead of connecting to one.
    """

    def __init__(self, address: str = "127.0.0.1:7788", token: Optional[str] = None,
                 tls: Union[bool, str, os.PathLike] = False, *, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, tls_server_name: Optional[str] = None, timeout: float = 3600.0,
                 cache_dir: Optional[Union[str, os.PathLike]] = None):
        self.address = address
        self.timeout = timeout
        self.cache_dir = cache_dir
        token = token if token is not None else os.environ.get("FUSOR_TOKEN")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        options: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", _MAX_MESSAGE),
                                          ("grpc.max_send_message_length", _MAX_MESSAGE),
                                          # a scheduler that went away is dialled again at least every 2 s
                                          ("grpc.initial_reconnect_backoff_ms", 200),
                                          ("grpc.min_reconnect_backoff_ms", 200),
                                          ("grpc.max_reconnect_backoff_ms", 2000)]
        if (tls_cert is None) != (tls_key is None):
            raise FusorError("tls_cert and tls_key go together")
        if tls or tls_cert:
            def read(path: Optional[Union[str, os.PathLike]]) -> Optional[bytes]:
                try:
                    return Path(path).read_bytes() if path else None
                except OSError as e:
                    raise FusorError(f"cannot read {path}: {e.strerror}") from None

            ca = tls if isinstance(tls, (str, os.PathLike)) else None
            credentials = grpc.ssl_channel_credentials(read(ca), read(tls_key), read(tls_cert))
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._embedded: Optional[EmbeddedService] = None

    @classmethod
    def embedded(cls, db: Optional[Union[str, os.PathLike]] = None, *, bin_dir: Optional[str] = None,
                 backend: str = "cpu", calibration_seconds: Optional[float] = None, startup_timeout: float = 120.0,
                 scheduler_args: Sequence[str] = (), worker_args: Sequence[str] = (), serving: bool = False,
                 worker_cores: Optional[int] = None, **client_args: Any) -> "Client":
        """A client of a private scheduler and worker started now (see :class:`fusor.EmbeddedService`; its
        ``serving`` and ``worker_cores`` keep tuning out of a serving process's way).

        They stop when the client is closed (use it in a ``with`` block) or the process exits.
        It returns once the worker has registered, so the first tune starts at once.
        """
        service = EmbeddedService(db=db, bin_dir=bin_dir, backend=backend, calibration_seconds=calibration_seconds,
                                  startup_timeout=startup_timeout, scheduler_args=scheduler_args,
                                  worker_args=worker_args, serving=serving, worker_cores=worker_cores)
        try:
            client = cls(service.address, **client_args)
        except BaseException:
            service.close()
            raise
        client._embedded = service
        try:
            service.wait_for_worker(client.workers)
        except BaseException:
            client.close()
            raise
        return client

    @property
    def requests(self) -> Optional[Requests]:
        """The request counters of an embedded service started with ``serving=True`` (None otherwise): count a
        request with ``with client.requests:`` and the worker times kernels between them."""
        return self._embedded.requests if self._embedded is not None else None

    def close(self) -> None:
        """Closes the channel, and stops the embedded scheduler and worker if this client started them."""
        self._channel.close()
        if self._embedded is not None:
            self._embedded.close()
            self._embedded = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------

    def _call(self, method: Callable, request: Any, timeout: Optional[float], retry: bool = False) -> Any:
        """One unary call; with `retry` (calls that may be asked again: they join their task), asked again while
        the scheduler is UNAVAILABLE."""
        backoff = _Backoff(retry)
        while True:
            try:
                return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                if not backoff.again(e):
                    raise from_grpc(e) from e

    def _stream(self, method: Callable, request: Any, timeout: Optional[float], retry: bool = False) -> Iterator[Any]:
        backoff = _Backoff(retry)
        while True:
            call = method(request, timeout=timeout or self.timeout, metadata=self._metadata)
            try:
                yield from call
                return
            except grpc.RpcError as e:
                if not backoff.again(e):
                    raise from_grpc(e) from e
            finally:
                call.cancel()  # a caller that stops iterating early ends the call (a no-op once it has ended)

    @staticmethod
    def _selector(backend: str, target: Optional[str]) -> target_pb2.TargetSelector:
        if backend not in _BACKENDS:
            raise FusorError(f"backend '{backend}' is not cpu or cuda")
        return target_pb2.TargetSelector(backend=_BACKENDS[backend], fingerprint=target or "")

    @staticmethod
    def _workload(chain: ChainLike, vary: Sequence[str]) -> Any:
        """The chain's ``fusor.v1.Workload``, with the dims whose size changes from call to call."""
        workload = as_chain(chain).workload
        if not vary:
            return workload
        varied = type(workload)()
        varied.CopyFrom(workload)
        varied.vary.extend(vary)
        return varied

    def tune_events(self, chain: ChainLike, *, budget: int = 0, force: bool = False, backend: str = "cpu",
                    target: Optional[str] = None, timeout: Optional[float] = None, vary: Sequence[str] = (),
                    transfer: bool = False) -> Iterator[Event]:
        """Tunes a chain (or answers from the cache), yielding :class:`Started`, :class:`Progress` events and
        last the :class:`Result`."""
        request = scheduler_pb2.TuneRequest(workload=self._workload(chain, vary), target=self._selector(backend, target),
                                            options=scheduler_pb2.TuneOptions(budget=budget, force=force,
                                                                              transfer=transfer))
        for event in self._stream(self._stub.Tune, request, timeout, retry=True):
            kind = event.WhichOneof("event")
            if kind == "started":
                yield Started.from_proto(event.started)
            elif kind == "progress":
                yield Progress.from_proto(event.progress)
            elif kind == "result":
                yield Result.from_proto(event.result)

    def tune(self, chain: ChainLike, *, budget: int = 0, force: bool = False, backend: str = "cpu",
             target: Optional[str] = None, progress: Optional[Callable[[Event], None]] = None,
             timeout: Optional[float] = None, vary: Sequence[str] = (), transfer: bool = False) -> Result:
        """Tunes a chain (or answers from the cache) and returns the result.

        Args:
            chain: chain text, a chain file's path, a :class:`ChainBuilder` or a :class:`Chain`.
            budget: most candidates measured (0: the scheduler's default).
            force: tune again even when the cache has an answer.
            backend, target: the target: "cpu" or "cuda", and optionally a target fingerprint.
            progress: called with each :class:`Started` and :class:`Progress` event.
            vary: dims whose size changes from call to call: tuned for the range of sizes around the one given
                (2..16, 17..64, 65..256, ...), one kernel for the range (CPU targets).
            transfer: on a miss, where a record of the same chain at other sizes exists, measure its schedule at
                these sizes alone (seconds) instead of searching.
        """
        for event in self.tune_events(chain, budget=budget, force=force, backend=backend, target=target,
                                      timeout=timeout, vary=vary, transfer=transfer):
            if isinstance(event, Result):
                return event
            if progress is not None:
                progress(event)
        raise FusorError("the scheduler's tune stream ended without a result")

    def compile_source(self, chain: ChainLike, *, budget: int = 0, cache_only: bool = False, backend: str = "cpu",
                       target: Optional[str] = None, timeout: Optional[float] = None, vary: Sequence[str] = (),
                       transfer: bool = False) -> scheduler_pb2.CompileResponse:
        """The best kernel's source, metadata and (CUDA) cubin as the scheduler returns them, unbuilt: a
        ``fusor.v1.CompileResponse``. Tunes first on a cache miss, unless ``cache_only`` (then NotFoundError).
        ``vary`` and ``transfer`` as for :meth:`tune`."""
        request = scheduler_pb2.CompileRequest(workload=self._workload(chain, vary),
                                               target=self._selector(backend, target),
                                               options=scheduler_pb2.TuneOptions(budget=budget, transfer=transfer),
                                               cache_only=cache_only)
        return self._call(self._stub.Compile, request, timeout, retry=True)

    def compile(self, chain: ChainLike, *, budget: int = 0, cache_only: bool = False, backend: str = "cpu",
                target: Optional[str] = None, timeout: Optional[float] = None, num_threads: Optional[int] = None,
                compiler: Optional[str] = None, vary: Sequence[str] = (), transfer: bool = False,
                background: bool = False) -> Kernel:
        """The best kernel of a chain, callable: tuned first on a cache miss (unless ``cache_only``: then
        NotFoundError).

        A CPU kernel is built on this machine with ``compiler`` (default $CXX, else c++; once, then cached in
        ``cache_dir``) and callable on NumPy arrays and PyTorch CPU tensors, on ``num_threads`` threads by
        default (at the lowest CPU priority with ``background``: beside a serving process's requests). A CUDA
        kernel is launched on PyTorch CUDA tensors. With ``vary``, the kernel takes any size of its range
        (:attr:`Kernel.ranges`), read from its arguments' shapes.
        """
        chain = as_chain(chain)
        response = self.compile_source(chain, budget=budget, cache_only=cache_only, backend=backend, target=target,
                                       timeout=timeout, vary=vary, transfer=transfer)
        if response.language == "cuda":
            if num_threads is not None or compiler is not None:
                raise FusorError("num_threads and compiler apply to CPU kernels, not to a CUDA kernel")
            from ._cuda import CudaKernel

            return CudaKernel(response, name=chain.name)
        if response.language != "c++":
            raise FusorError(f"the scheduler answered with a '{response.language}' kernel, which this client cannot run")
        return CpuKernel(response, cache_dir=self.cache_dir, compiler=compiler, num_threads=num_threads,
                         name=chain.name, background=background)

    def lookup(self, chain: ChainLike, *, backend: str = "cpu", target: Optional[str] = None,
               timeout: Optional[float] = None, vary: Sequence[str] = ()) -> Optional[Result]:
        """The cached result of a chain, or None on a miss (nothing is tuned): the chain's own record, a record of
        a range that holds its sizes, or the nearest record's schedule at other sizes (``Result.answer`` says
        which)."""
        request = scheduler_pb2.LookupRequest(workload=self._workload(chain, vary),
                                              target=self._selector(backend, target))
        try:
            return Result.from_proto(self._call(self._stub.Lookup, request, timeout).result)
        except NotFoundError:
            return None

    def explain(self, chain: ChainLike, *, backend: str = "cpu", target: Optional[str] = None,
                timeout: Optional[float] = None, vary: Sequence[str] = ()) -> Explanation:
        """Why a chain has no record of its own (``fusor lookup --why``): the nearest record and each field of the
        key or target in which it differs, with the lookup's answer, if any, as ``.result``."""
        request = scheduler_pb2.LookupRequest(workload=self._workload(chain, vary),
                                              target=self._selector(backend, target), explain=True)
        response = self._call(self._stub.Lookup, request, timeout)
        result = Result.from_proto(response.result) if response.HasField("result") else None
        return Explanation.from_proto(response.why, result)

    def workers(self, timeout: Optional[float] = None) -> List[Worker]:
        """The workers the scheduler knows, alive or lost."""
        response = self._call(self._stub.ListWorkers, scheduler_pb2.ListWorkersRequest(), timeout)
        return [Worker.from_proto(w) for w in response.workers]

    def task(self, task_id: str, timeout: Optional[float] = None) -> Task:
        """A tuning task's state, progress and result (NotFoundError for an unknown id)."""
        return Task.from_proto(self._call(self._stub.GetTask, scheduler_pb2.GetTaskRequest(task_id=task_id), timeout))

    def sweep_events(self, entries: Sequence[Union[SweepEntry, ChainLike]], *, name: str = "python",
                     budget: int = 0, detach: bool = False, backend: str = "cpu", target: Optional[str] = None,
                     timeout: Optional[float] = None) -> Iterator[Any]:
        """Sweeps chains, yielding the scheduler's ``SweepStarted``, ``SweepProgress`` and last ``SweepReport``
        (fusor.v1 messages). Each distinct chain is tuned once; an identical running sweep is resumed."""
        request = scheduler_pb2.SweepRequest(name=name, target=self._selector(backend, target),
                                             options=scheduler_pb2.TuneOptions(budget=budget), detach=detach)
        for entry in entries:
            if not isinstance(entry, SweepEntry):
                entry = SweepEntry(entry)
            chain = as_chain(entry.chain)
            request.entries.add(model=entry.model or chain.name, role=entry.role, source=entry.source,
                                instances=entry.instances, chain=chain.structured())
        for event in self._stream(self._stub.Sweep, request, timeout):
            yield getattr(event, event.WhichOneof("event"))

    def sweep(self, entries: Sequence[Union[SweepEntry, ChainLike]], *, name: str = "python", budget: int = 0,
              backend: str = "cpu", target: Optional[str] = None, progress: Optional[Callable[[Any], None]] = None,
              timeout: Optional[float] = None) -> scheduler_pb2.SweepReport:
        """Sweeps chains to the end and returns the ``fusor.v1.SweepReport``; ``progress`` gets the other events."""
        for event in self.sweep_events(entries, name=name, budget=budget, backend=backend, target=target,
                                       timeout=timeout):
            if isinstance(event, scheduler_pb2.SweepReport):
                return event
            if progress is not None:
                progress(event)
        raise FusorError("the scheduler's sweep stream ended without a report")

    def get_sweep(self, sweep_id: str, timeout: Optional[float] = None) -> scheduler_pb2.SweepReport:
        """A sweep's report as it stands."""
        return self._call(self._stub.GetSweep, scheduler_pb2.GetSweepRequest(sweep_id=sweep_id), timeout)
