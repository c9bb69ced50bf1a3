"""The asyncio client and worker against the real server (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
from typing import Dict, List

import pytest

from brood_client import (
    AsyncClient,
    AsyncWorker,
    ChildEvent,
    Done,
    Envelope,
    ExternalRunner,
    NotFound,
    SimRunner,
    Task,
    WorkItem,
)

from helpers import Server, unique


async def next_envelope(client: AsyncClient, session_id: str) -> Envelope:
    for _ in range(1000):
        env = await client.boundary(session_id, "py-async")
        if env is not None:
            return env
        await asyncio.sleep(0.02)
    raise AssertionError(f"no envelope for {session_id} in 20 s")


def test_delegate_boundary_ack_with_the_async_client(server: Server) -> None:
    async def main() -> None:
        async with server.async_client(timeout=10) as client:
            sid = unique("async")
            assert (await client.put_session(sid, addressable=True)).wake_capable
            call = await client.delegate(sid, [Task(f"t{i}", SimRunner(ms=5)) for i in range(3)],
                                         independent_completions=True)
            seen: List[str] = []
            while len(seen) < 3:
                env = await next_envelope(client, sid)
                seen += [i.child_id for i in env.items]
                assert (await client.ack(env.claim_id)).delivered == len(env.items)
            assert sorted(seen) == [f"{call.call_id}.{i}" for i in range(3)]
            assert await client.boundary(sid, "py-async") is None
            assert (await client.get_session(sid)).counts.delivered == 3

    asyncio.run(main())


def test_the_async_client_raises_the_servers_refusal(server: Server) -> None:
    async def main() -> None:
        async with server.async_client() as client:
            with pytest.raises(NotFound) as caught:
                await client.get_call("deleg_0000000000000000")
            assert (caught.value.status, caught.value.code) == (404, "unknown_call")

    asyncio.run(main())


def test_the_async_stream_tells_a_delegated_call_ready(server: Server) -> None:
    async def main() -> None:
        async with server.async_client() as client:
            sid = unique("async-events")
            await client.put_session(sid, addressable=True)
            statuses: List[str] = []
            async with client.events(sid, read_timeout=20) as stream:
                first = await stream.__anext__()
                assert (first.name, first.data.ready) == ("ready", 0)
                call = await client.delegate(sid, [Task("a", SimRunner(ms=10))])
                async for event in stream:
                    if isinstance(event.data, ChildEvent) and event.data.call_id == call.call_id:
                        statuses.append(event.data.status)
                    if event.name == "ready" and event.data.ready == 1:
                        break
            assert statuses == ["queued", "running", "succeeded"]

    asyncio.run(main())


def test_the_async_worker_runs_coroutine_and_plain_handlers(server: Server) -> None:
    async def main() -> Dict[str, tuple]:
        async with server.async_client(timeout=10) as client:
            sid = unique("async-worker")
            await client.put_session(sid, addressable=True)
            queue = unique("q")
            call = await client.delegate(sid, [Task(g, ExternalRunner(queue=queue)) for g in ("a", "b", "c")],
                                         independent_completions=True)

            async def slow_upper(item: WorkItem) -> Done:
                await asyncio.sleep(2.5)  # past the 1 s lease: heartbeats keep the child
                return Done(summary=item.goal.upper())

            def fails(item: WorkItem) -> None:
                raise ValueError(f"no {item.goal}")

            first = AsyncWorker(client, "aw", queue, handler=slow_upper, lease_ms=1_000, wait_ms=1_000)
            assert await first.run(max_items=1) == 1
            second = AsyncWorker(client, "aw", queue, handler=fails, wait_ms=1_000)
            assert await second.run(max_items=2) == 2
            got: Dict[str, tuple] = {}
            while len(got) < 3:
                env = await next_envelope(client, sid)
                got.update({i.child_id: (i.status, i.summary, i.error) for i in env.items})
                await client.ack(env.claim_id)
            return {k.replace(call.call_id, "call"): v for k, v in got.items()}

    assert asyncio.run(main()) == {
        "call.0": ("succeeded", "A", None),
        "call.1": ("failed", None, "ValueError: no b"),
        "call.2": ("failed", None, "ValueError: no c"),
    }


def test_stop_ends_an_idle_async_worker(server: Server) -> None:
    async def main() -> int:
        async with server.async_client() as client:
            worker = AsyncWorker(client, "aw", unique("q"), handler=lambda item: None, wait_ms=300)
            running = asyncio.ensure_future(worker.run())
            await asyncio.sleep(0.1)
            worker.stop()
            return await asyncio.wait_for(running, 3)

    assert asyncio.run(main()) == 0
