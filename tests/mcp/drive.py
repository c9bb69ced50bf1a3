"""Drives brood's MCP server with the official MCP Python SDK (`mcp` on PyPI), as an agent
runtime would: list the tools, delegate sim children, call `boundary` until their envelope
comes, ack it, and check the status shows them delivered; then the refusals (a bad argument is
an error result naming it, an unknown tool a JSON-RPC error) and the resources.

Run by tests/mcp.rs, one transport a run:

    drive.py http URL [--key KEY]               streamable HTTP to URL (a `brood serve`'s /mcp)
    drive.py stdio PROGRAM -- ARG...            stdio to `PROGRAM ARG...` (a `brood mcp`)

The stdio server gets only the SDK's default environment (HOME, PATH, ...): no variable of
brood's own reaches it from this process. Prints what it did; exits non-zero (an assertion) on the first
thing that is not as it should be.
"""

import argparse
import asyncio
import json
import sys
import time
import warnings

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

TOOLS = {"delegate", "boundary", "ack", "release", "cancel", "status"}
CHILDREN = 3
SIM = {"kind": "sim", "ms": 50}


def text_of(result):
    return "".join(c.text for c in result.content if c.type == "text")


async def collect(client, session_id, deadline_s=20.0):
    """Calls `boundary` until an envelope comes; returns it (its structured content)."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = await client.call_tool("boundary", {"session_id": session_id, "consumer": "drive.py"})
        assert not result.is_error, text_of(result)
        envelope = result.structured_content
        if envelope["claim_id"] is not None:
            assert "claim_id: " + envelope["claim_id"] in text_of(result), text_of(result)
            return envelope
        assert text_of(result).startswith("Nothing is ready"), text_of(result)
        assert time.monotonic() < deadline, "no envelope came within %ss" % deadline_s
        await asyncio.sleep(0.05)


async def exercise(client, session_id):
    print("protocol version", client.protocol_version)
    assert client.protocol_version == "2025-11-25", client.protocol_version
    assert "boundary" in (client.instructions or ""), client.instructions
    with warnings.catch_warnings():
        # The SDK warns that the newer per-request protocol has no ping; this one has.
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await client.send_ping()

    tools = (await client.list_tools()).tools
    assert {t.name for t in tools} == TOOLS, [t.name for t in tools]
    for tool in tools:
        assert tool.input_schema["type"] == "object", tool
        assert tool.description, tool
    print("tools", sorted(t.name for t in tools))

    tasks = [{"goal": "child %d" % i, "runner": SIM} for i in range(CHILDREN)]
    delegated = await client.call_tool("delegate", {"session_id": session_id, "tasks": tasks})
    assert not delegated.is_error, text_of(delegated)
    call = delegated.structured_content
    assert call["mode"] == "background", call
    print("delegated", call["call_id"])

    items = []
    while len(items) < CHILDREN:
        envelope = await collect(client, session_id)
        items += envelope["items"]
        acked = await client.call_tool("ack", {"claim_id": envelope["claim_id"]})
        assert not acked.is_error, text_of(acked)
        assert acked.structured_content == {"delivered": len(envelope["items"])}, acked.structured_content
        print("acked", envelope["claim_id"], len(envelope["items"]), "items")
    assert sorted(i["task_index"] for i in items) == list(range(CHILDREN)), items
    assert all(i["status"] == "succeeded" and i["call_id"] == call["call_id"] for i in items), items

    status = await client.call_tool("status", {"session_id": session_id})
    assert not status.is_error, text_of(status)
    counts = status.structured_content["counts"]
    assert counts["delivered"] == CHILDREN and counts["ready"] == 0 and counts["claimed"] == 0, counts
    of_call = (await client.call_tool("status", {"call_id": call["call_id"]})).structured_content
    assert [c["delivery"] for c in of_call["children"]] == ["delivered"] * CHILDREN, of_call
    print("status", counts)

    # A bad argument: an error result that names it, for the model to correct.
    bad = await client.call_tool("delegate", {"session_id": session_id, "tasks": [{"goal": "no runner"}]})
    assert bad.is_error, bad
    assert "invalid_request" in text_of(bad) and "runner" in text_of(bad), text_of(bad)
    missing = await client.call_tool("boundary", {})
    assert missing.is_error and "session_id" in text_of(missing), text_of(missing)
    lost = await client.call_tool("ack", {"claim_id": "clm_no_such_claim"})
    assert lost.is_error and text_of(lost).startswith("unknown_claim"), text_of(lost)
    print("bad arguments", text_of(bad))

    # An unknown tool: a JSON-RPC error, not a tool result.
    try:
        await client.call_tool("deploy", {})
    except MCPError as e:
        assert e.code == -32602 and "deploy" in str(e), e
        print("unknown tool", e)
    else:
        raise AssertionError("an unknown tool was answered with a tool result")

    templates = (await client.list_resource_templates()).resource_templates
    assert {t.uri_template for t in templates} == {
        "brood://sessions/{session_id}",
        "brood://sessions/{session_id}/events",
    }, templates
    listed = {str(r.uri) for r in (await client.list_resources()).resources}
    assert "brood://sessions/%s" % session_id in listed, listed
    session = json.loads((await client.read_resource("brood://sessions/%s" % session_id)).contents[0].text)
    assert session["counts"]["delivered"] == CHILDREN, session
    events = json.loads((await client.read_resource("brood://sessions/%s/events" % session_id)).contents[0].text)
    ended = [e for e in events["events"] if e["event"] == "child" and e["status"] == "succeeded"]
    assert len(ended) == CHILDREN, events
    assert any(e["event"] == "claim" and e["change"] == "acked" for e in events["events"]), events
    try:
        await client.read_resource("brood://sessions/no-such-session")
    except MCPError as e:
        assert e.code == -32002 and "unknown_session" in str(e), e
    else:
        raise AssertionError("an unknown session was read")
    print("resources", len(events["events"]), "events")


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["http", "stdio"])
    parser.add_argument("target")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--key")
    parser.add_argument("--session", default="mcp-drive")
    a = parser.parse_args()
    if a.transport == "http":
        headers = {"Authorization": "Bearer " + a.key} if a.key else None
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
            async with Client(streamable_http_client(a.target, http_client=http)) as client:
                await exercise(client, a.session)
    else:
        server = StdioServerParameters(command=a.target, args=a.args)
        async with Client(server) as client:
            await exercise(client, a.session)
    print("ok")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
