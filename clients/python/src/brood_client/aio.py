"""The asyncio client, :class:`AsyncClient`: the methods of :class:`brood_client.Client`, as
coroutines, on an :class:`httpx.AsyncClient`. Each method's documentation is on
:class:`~brood_client.Client`; they take the same arguments and answer the same models.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, TypeVar

import httpx

from . import _endpoints as ep
from . import models
from ._holder import Holders, resend_at_base
from .client import DEFAULT_TIMEOUT, DEFAULT_URL, EVENTS_READ_TIMEOUT, TimeoutLike, events_timeout, http_options
from .events import AsyncEventStream

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """An asyncio client of one brood server; see :class:`brood_client.Client`::

        async with AsyncClient("http://127.0.0.1:7070") as brood:
            await brood.put_session("chat-1", addressable=True)
            await brood.delegate("chat-1", [Task("review PR 12", SimRunner(ms=50))])
            envelope = await brood.boundary("chat-1", consumer="cli")
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: Optional[str] = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
        headers: Optional[Mapping[str, str]] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        follow_holder: bool = False,
    ) -> None:
        options = http_options(base_url, api_key, timeout, headers)
        self.base_url: str = options["base_url"]
        self._timeout: httpx.Timeout = options["timeout"]
        self._http = httpx.AsyncClient(transport=transport, **options)
        self._holders: Optional[Holders] = Holders() if follow_holder else None

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the client's connections."""
        await self._http.aclose()

    async def _send(self, request: "ep.Request[T]") -> T:
        holders = self._holders
        hinted = holders.url(request.path) if holders is not None else None
        try:
            response = await self._request(request, hinted or request.path)
        except httpx.TransportError as e:
            if holders is None or hinted is None:
                raise request.failed(e) from e
            holders.forget(request.path)
            if not resend_at_base(e):
                raise request.failed(e) from e
            try:
                response = await self._request(request, request.path)
            except httpx.TransportError as e:
                raise request.failed(e) from e
        if holders is not None:
            holders.learn(request.path, response)
        return request.answer(response)

    async def _request(self, request: "ep.Request[Any]", url: str) -> httpx.Response:
        return await self._http.request(
            request.method,
            url,
            json=request.body,
            params=request.params,
            headers=request.headers,
            timeout=request.timeout_from(self._timeout),
        )

    # -- sessions --

    async def put_session(
        self,
        session_id: str,
        *,
        wake_url: Optional[str] = None,
        addressable: Optional[bool] = None,
        max_concurrent_children: Optional[int] = None,
    ) -> models.Session:
        """See :meth:`brood_client.Client.put_session`."""
        return await self._send(ep.put_session(session_id, wake_url, addressable, max_concurrent_children))

    async def get_session(
        self,
        session_id: str,
        *,
        delivered: Optional[bool] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> models.SessionDetail:
        """See :meth:`brood_client.Client.get_session`."""
        return await self._send(ep.get_session(session_id, delivered, after, limit))

    async def list_sessions(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> models.SessionPage:
        """See :meth:`brood_client.Client.list_sessions`."""
        return await self._send(ep.list_sessions(limit, after))

    async def set_turn(self, session_id: str, state: str) -> models.TurnState:
        """See :meth:`brood_client.Client.set_turn`."""
        return await self._send(ep.set_turn(session_id, state))

    # -- delegation, boundaries, claims --

    async def delegate(
        self,
        session_id: str,
        tasks: Iterable[ep.TaskLike],
        *,
        mode: Optional[str] = None,
        independent_completions: Optional[bool] = None,
        idempotency_key: Optional[str] = None,
        idempotency_header: Optional[str] = None,
        traceparent: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> models.Delegation:
        """See :meth:`brood_client.Client.delegate`."""
        return await self._send(ep.delegate(session_id, tasks, mode, independent_completions, idempotency_key,
                                            idempotency_header, traceparent, timeout))

    async def get_call(self, call_id: str) -> models.Call:
        """See :meth:`brood_client.Client.get_call`."""
        return await self._send(ep.get_call(call_id))

    async def boundary(
        self,
        session_id: str,
        consumer: str,
        *,
        lease_ms: Optional[int] = None,
        max_items: Optional[int] = None,
        max_bytes: Optional[int] = None,
        ack: Optional[str] = None,
    ) -> Optional[models.Envelope]:
        """See :meth:`brood_client.Client.boundary`."""
        return await self._send(ep.boundary(session_id, consumer, lease_ms, max_items, max_bytes, ack))

    async def ack(self, claim_id: str) -> models.Acked:
        """See :meth:`brood_client.Client.ack`."""
        return await self._send(ep.ack(claim_id))

    async def release(self, claim_id: str, reason: str, *, retry_after_ms: Optional[int] = None) -> models.Released:
        """See :meth:`brood_client.Client.release`."""
        return await self._send(ep.release(claim_id, reason, retry_after_ms))

    async def cancel_call(self, call_id: str, *, reason: Optional[str] = None) -> models.Cancelled:
        """See :meth:`brood_client.Client.cancel_call`."""
        return await self._send(ep.cancel("calls", call_id, reason))

    async def cancel_unit(self, unit_id: str, *, reason: Optional[str] = None) -> models.Cancelled:
        """See :meth:`brood_client.Client.cancel_unit`."""
        return await self._send(ep.cancel("units", unit_id, reason))

    async def cancel_child(self, child_id: str, *, reason: Optional[str] = None) -> models.Cancelled:
        """See :meth:`brood_client.Client.cancel_child`."""
        return await self._send(ep.cancel("children", child_id, reason))

    # -- dead letters --

    async def dead_letters(self, *, session_id: Optional[str] = None) -> models.DeadLetters:
        """See :meth:`brood_client.Client.dead_letters`."""
        return await self._send(ep.dead_letters(session_id))

    async def redrive(
        self,
        *,
        child_ids: Optional[List[str]] = None,
        session_id: Optional[str] = None,
        all_: bool = False,
        limit: Optional[int] = None,
    ) -> models.Redriven:
        """See :meth:`brood_client.Client.redrive`."""
        return await self._send(ep.redrive(child_ids, session_id, all_, limit))

    # -- events --

    def events(self, session_id: str, *, read_timeout: Optional[float] = EVENTS_READ_TIMEOUT) -> AsyncEventStream:
        """See :meth:`brood_client.Client.events`: use it with ``async with`` / ``async for``."""
        path = ep.events_path(session_id)
        timeout = events_timeout(self._timeout, read_timeout)
        return AsyncEventStream(
            lambda: self._http.stream("GET", path, headers={"Accept": "text/event-stream"}, timeout=timeout),
            f"GET {path}",
        )

    # -- external workers --

    async def poll_work(
        self,
        worker: str,
        *,
        queue: Optional[str] = None,
        wait_ms: Optional[int] = None,
        lease_ms: Optional[int] = None,
    ) -> Optional[models.WorkItem]:
        """See :meth:`brood_client.Client.poll_work`."""
        return await self._send(ep.poll_work(worker, queue, wait_ms, lease_ms))

    async def heartbeat(self, child_id: str, token: str, *, progress: Optional[str] = None) -> models.Heartbeat:
        """See :meth:`brood_client.Client.heartbeat`."""
        return await self._send(ep.heartbeat(child_id, token, progress))

    async def complete(
        self,
        child_id: str,
        token: str,
        status: str,
        *,
        summary: Optional[str] = None,
        error: Optional[str] = None,
        output: Any = None,
    ) -> models.Completion:
        """See :meth:`brood_client.Client.complete`."""
        return await self._send(ep.complete(child_id, token, status, summary, error, output))

    async def take_work(
        self,
        child_id: str,
        worker: str,
        lease_ms: int,
        *,
        take_id: Optional[str] = None,
        answer_by_ms: Optional[int] = None,
    ) -> models.WorkItem:
        """See :meth:`brood_client.Client.take_work`."""
        return await self._send(ep.take_work(child_id, worker, lease_ms, take_id, answer_by_ms))

    async def untake_work(self, child_id: str, take_id: str) -> None:
        """See :meth:`brood_client.Client.untake_work`."""
        await self._send(ep.untake_work(child_id, take_id))

    # -- operations --

    async def healthz(self) -> models.Health:
        """See :meth:`brood_client.Client.healthz`."""
        return await self._send(ep.healthz())

    async def readyz(self) -> models.Health:
        """See :meth:`brood_client.Client.readyz`."""
        return await self._send(ep.readyz())

    async def openapi(self) -> Dict[str, Any]:
        """See :meth:`brood_client.Client.openapi`."""
        return await self._send(ep.openapi())

    async def metrics(self) -> str:
        """See :meth:`brood_client.Client.metrics`."""
        return await self._send(ep.metrics())

    async def ui(self) -> str:
        """See :meth:`brood_client.Client.ui`."""
        return await self._send(ep.ui())
