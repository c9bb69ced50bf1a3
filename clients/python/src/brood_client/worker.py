"""The worker kit: run the children of ``external`` runners with a function of yours.

A :class:`Worker` polls a queue (a long poll of ``wait_ms``), hands each child it gets — a
:class:`~brood_client.WorkItem` — to your handler, heartbeats in the background while the
handler runs (every ``heartbeat_fraction`` of the lease, so a slow handler keeps the child),
and completes the child with what the handler answered::

    worker = Worker(client, worker="w1", queue="default")

    @worker.handler
    def render(item):
        return {"pages": 3}          # the output (any JSON value): succeeded

    worker.run()                     # until worker.stop(), from a signal handler or a thread

What the handler answers says how the child ends:

- a :class:`Done`: succeeded, with its ``summary`` and ``output``;
- a ``str``: succeeded, with it as the summary;
- anything else: succeeded, with it as the output (``None``: none);
- an exception raised: failed, with the exception as the error.

A completion is sent again while no reply comes (the connection broke, the server is
restarting, 503): sending the same completion again is answered with the recorded outcome, so
a completion whose reply was lost is recorded once. A 409 (``stale_token``: the lease ran out
and the child went back to the queue; ``child_ended``: it ended otherwise, e.g. cancelled) or a
404 means the child is no longer this worker's: it is logged and given up. A completion the
server refuses as invalid (an output over its limit) is sent again as a failure saying why.

One worker runs one child at a time; run several (threads, processes) for more.
:class:`AsyncWorker` is the asyncio twin: its handler may be a coroutine function, or a plain
function, which runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Optional, TypeVar, Union

from .aio import AsyncClient
from .client import Client
from .errors import BroodError, Conflict, ConnectionFailed, InvalidRequest, NotFound, PayloadTooLarge
from .models import Completion, WorkItem

__all__ = ["Worker", "AsyncWorker", "Done", "Handler", "AsyncHandler"]

log = logging.getLogger("brood_client.worker")

#: A handler of the blocking :class:`Worker`.
Handler = Callable[[WorkItem], Any]
#: A handler of :class:`AsyncWorker`: a coroutine function, or a plain one.
AsyncHandler = Callable[[WorkItem], Union[Awaitable[Any], Any]]
F = TypeVar("F", bound=Callable[..., Any])

#: The waits between attempts of a request that got no reply, in seconds (the last repeats).
_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class Done:
    """A handler's answer that sets both the ``summary`` and the ``output`` of a success."""

    summary: Optional[str] = None
    output: Any = None


def _outcome(result: Any) -> Dict[str, Any]:
    """The completion of a child whose handler answered ``result``."""
    if isinstance(result, Done):
        done = result
    elif isinstance(result, str):
        done = Done(summary=result)
    else:
        done = Done(output=result)
    try:
        json.dumps(done.output)
    except (TypeError, ValueError) as e:
        return {"status": "failed", "error": f"the handler's output is not JSON: {e}"}
    return {"status": "succeeded", "summary": done.summary, "output": done.output}


def _failure(error: BaseException) -> Dict[str, Any]:
    """The completion of a child whose handler raised ``error``."""
    return {"status": "failed", "error": f"{type(error).__name__}: {error}"}


def _transient(error: BroodError) -> bool:
    """Whether the same request may be answered otherwise later: no reply, or a 5xx."""
    return isinstance(error, ConnectionFailed) or error.status >= 500


def _gone(error: BroodError) -> bool:
    """Whether the child is no longer this worker's (its lease ran out, it ended, it is unknown)."""
    return isinstance(error, (Conflict, NotFound))


def _backoff(attempt: int) -> float:
    return _BACKOFF[min(attempt, len(_BACKOFF) - 1)]


class _Completing:
    """The completion of one child, and what to do when sending it fails."""

    def __init__(self, item: WorkItem, outcome: Dict[str, Any], complete_for: float) -> None:
        self.item = item
        self.outcome = outcome
        self._deadline = time.monotonic() + complete_for
        self._attempt = 0

    def retry_after(self, error: BroodError) -> Optional[float]:
        """Seconds to wait before sending :attr:`outcome` again after ``error``, or ``None`` to
        give the child up."""
        child = self.item.child_id
        if _gone(error):
            log.warning("gave up %s: %s", child, error)
            return None
        if self.outcome["status"] == "succeeded" and isinstance(error, (InvalidRequest, PayloadTooLarge)):
            log.warning("completion of %s refused, completing it as failed: %s", child, error)
            self.outcome = {"status": "failed", "error": f"the worker's completion was refused: {error.message}"}
            return 0.0
        if not _transient(error) or time.monotonic() >= self._deadline:
            log.error("could not complete %s: %s", child, error)
            return None
        log.info("completion of %s got no answer, sending it again: %s", child, error)
        wait = _backoff(self._attempt)
        self._attempt += 1
        return wait


class _Settings:
    """What both workers are configured with."""

    def __init__(
        self, worker: str, queue: str, lease_ms: int, wait_ms: int, heartbeat_fraction: float, complete_for: float
    ) -> None:
        if not 0 < heartbeat_fraction < 1:
            raise ValueError(f"heartbeat_fraction is {heartbeat_fraction}; it must be between 0 and 1")
        self.worker, self.queue = worker, queue
        self.lease_ms, self.wait_ms = lease_ms, wait_ms
        self.heartbeat_fraction = heartbeat_fraction
        self.complete_for = complete_for

    def heartbeat_interval(self, lease_ms: int) -> float:
        """Seconds between two heartbeats of a child held for ``lease_ms``."""
        return lease_ms * self.heartbeat_fraction / 1000


class Worker:
    """A blocking worker: polls ``queue`` as ``worker`` and runs each child with the handler,
    heartbeating from a thread (see the module's notes).

    ``lease_ms`` is the lease asked for each child (1000 to 3600000); ``wait_ms`` the long
    poll's wait (0 to 30000), and so the longest :meth:`stop` waits while no child comes;
    ``heartbeat_fraction`` of the lease passes between heartbeats; a completion that gets no
    reply is sent again for ``complete_for`` seconds.
    """

    def __init__(
        self,
        client: Client,
        worker: str,
        queue: str = "default",
        *,
        handler: Optional[Handler] = None,
        lease_ms: int = 30_000,
        wait_ms: int = 5_000,
        heartbeat_fraction: float = 1 / 3,
        complete_for: float = 60.0,
    ) -> None:
        self.client = client
        self._settings = _Settings(worker, queue, lease_ms, wait_ms, heartbeat_fraction, complete_for)
        self._handler = handler
        self._stopping = threading.Event()

    def handler(self, fn: F) -> F:
        """Decorator: makes ``fn`` the handler."""
        self._handler = fn
        return fn

    def stop(self) -> None:
        """Asks :meth:`run` to end: the child being handled is finished and completed first, as
        is one the poll in flight hands out. Safe from any thread or a signal handler."""
        self._stopping.set()

    def run(self, max_items: Optional[int] = None) -> int:
        """Polls and handles children until :meth:`stop` (or ``max_items`` were handled);
        answers how many were handled. A poll that gets no reply is tried again after a wait;
        a refused poll (a wrong key, a bad setting) raises."""
        handled, failures = 0, 0
        while not self._stopping.is_set() and (max_items is None or handled < max_items):
            try:
                item = self.client.poll_work(
                    self._settings.worker,
                    queue=self._settings.queue,
                    wait_ms=self._settings.wait_ms,
                    lease_ms=self._settings.lease_ms,
                )
            except BroodError as e:
                if not _transient(e):
                    raise
                log.warning("poll of queue %r failed, trying again: %s", self._settings.queue, e)
                self._stopping.wait(_backoff(failures))
                failures += 1
                continue
            failures = 0
            if item is not None:
                self.handle(item)
                handled += 1
        return handled

    def handle(self, item: WorkItem) -> Optional[Completion]:
        """Runs the handler on ``item`` with heartbeats, and completes it; answers the recorded
        completion, or ``None`` when the child was given up (see the module's notes)."""
        if self._handler is None:
            raise RuntimeError("the worker has no handler: pass handler= or decorate one with @worker.handler")
        beats = _HeartbeatThread(self.client, item, self._settings.heartbeat_interval(item.lease_ms))
        beats.start()
        try:
            outcome = _outcome(self._handler(item))
        except Exception as e:  # the handler's failure is the child's
            log.info("handler failed on %s: %s", item.child_id, e)
            outcome = _failure(e)
        finally:
            beats.finish()
        return self._complete(item, outcome)

    def _complete(self, item: WorkItem, outcome: Dict[str, Any]) -> Optional[Completion]:
        completing = _Completing(item, outcome, self._settings.complete_for)
        while True:
            try:
                return self.client.complete(item.child_id, item.token, **completing.outcome)
            except BroodError as e:
                wait = completing.retry_after(e)
                if wait is None:
                    return None
                time.sleep(wait)


class _HeartbeatThread(threading.Thread):
    """Heartbeats one child every ``interval`` seconds until :meth:`finish`, or until the
    child is no longer the worker's."""

    def __init__(self, client: Client, item: WorkItem, interval: float) -> None:
        super().__init__(name=f"brood-heartbeat-{item.child_id}", daemon=True)
        self.client, self.item, self.interval = client, item, interval
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.client.heartbeat(self.item.child_id, self.item.token)
            except BroodError as e:
                if _gone(e):
                    log.warning("lost %s while its handler ran: %s", self.item.child_id, e)
                    return
                log.warning("heartbeat of %s failed, trying again: %s", self.item.child_id, e)

    def finish(self) -> None:
        """Stops the heartbeats and waits for one in flight."""
        self._done.set()
        self.join()


class AsyncWorker:
    """The asyncio :class:`Worker`: the same settings, on an :class:`~brood_client.AsyncClient`;
    heartbeats run as a task beside the handler."""

    def __init__(
        self,
        client: AsyncClient,
        worker: str,
        queue: str = "default",
        *,
        handler: Optional[AsyncHandler] = None,
        lease_ms: int = 30_000,
        wait_ms: int = 5_000,
        heartbeat_fraction: float = 1 / 3,
        complete_for: float = 60.0,
    ) -> None:
        self.client = client
        self._settings = _Settings(worker, queue, lease_ms, wait_ms, heartbeat_fraction, complete_for)
        self._handler = handler
        self._stopping = False

    def handler(self, fn: F) -> F:
        """Decorator: makes ``fn`` (a coroutine function, or a plain one) the handler."""
        self._handler = fn
        return fn

    def stop(self) -> None:
        """As :meth:`Worker.stop`."""
        self._stopping = True

    async def run(self, max_items: Optional[int] = None) -> int:
        """As :meth:`Worker.run`."""
        handled, failures = 0, 0
        while not self._stopping and (max_items is None or handled < max_items):
            try:
                item = await self.client.poll_work(
                    self._settings.worker,
                    queue=self._settings.queue,
                    wait_ms=self._settings.wait_ms,
                    lease_ms=self._settings.lease_ms,
                )
            except BroodError as e:
                if not _transient(e):
                    raise
                log.warning("poll of queue %r failed, trying again: %s", self._settings.queue, e)
                await asyncio.sleep(_backoff(failures))
                failures += 1
                continue
            failures = 0
            if item is not None:
                await self.handle(item)
                handled += 1
        return handled

    async def handle(self, item: WorkItem) -> Optional[Completion]:
        """As :meth:`Worker.handle`."""
        handler = self._handler
        if handler is None:
            raise RuntimeError("the worker has no handler: pass handler= or decorate one with @worker.handler")
        beats = asyncio.ensure_future(self._heartbeats(item))
        try:
            if inspect.iscoroutinefunction(handler):
                result = await handler(item)
            else:
                result = await asyncio.to_thread(handler, item)
            outcome = _outcome(result)
        except Exception as e:  # the handler's failure is the child's
            log.info("handler failed on %s: %s", item.child_id, e)
            outcome = _failure(e)
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        return await self._complete(item, outcome)

    async def _heartbeats(self, item: WorkItem) -> None:
        interval = self._settings.heartbeat_interval(item.lease_ms)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.client.heartbeat(item.child_id, item.token)
            except BroodError as e:
                if _gone(e):
                    log.warning("lost %s while its handler ran: %s", item.child_id, e)
                    return
                log.warning("heartbeat of %s failed, trying again: %s", item.child_id, e)

    async def _complete(self, item: WorkItem, outcome: Dict[str, Any]) -> Optional[Completion]:
        completing = _Completing(item, outcome, self._settings.complete_for)
        while True:
            try:
                return await self.client.complete(item.child_id, item.token, **completing.outcome)
            except BroodError as e:
                wait = completing.retry_after(e)
                if wait is None:
                    return None
                await asyncio.sleep(wait)
