"""A streaming client of an OpenAI-compatible completions server (``vllm serve``), standard
library only: asyncio connections, HTTP/1.1 with chunked bodies, server-sent events.

Load is closed-loop: ``concurrency`` workers each send a request, read its stream to the end and
send the next, until the request list or the time budget is spent. Every request records when it
was sent, when each streamed piece arrived and how many tokens the server says it made, so
TTFT (first token) and inter-token latencies are the ones a user would see.
"""

from __future__ import annotations

import asyncio
import json
import time

from lowbit.errors import LowbitError


class ClientError(LowbitError, RuntimeError):
    """The server answered a request with an error status or a malformed stream."""


async def _read_head(reader) -> tuple[int, dict]:
    status_line = await reader.readline()
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ClientError(f"not an HTTP response: {status_line[:100]!r}")
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return int(parts[1]), headers
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()


async def _body(reader, headers):
    """The response body's pieces as they arrive (chunked, sized, or up to the close)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            piece = await reader.readexactly(size)
            await reader.readexactly(2)  # the CRLF after each chunk
            yield piece
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while piece := await reader.read(65536):
            yield piece


async def stream_completion(host: str, port: int, payload: dict):
    """POST ``payload`` to ``/v1/completions`` and yield ``(arrival seconds, event JSON)`` per
    server-sent event, until ``[DONE]``."""
    body = json.dumps(payload).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
                     + body)
        await writer.drain()
        status, headers = await _read_head(reader)
        if status != 200:
            text = b"".join([p async for p in _body(reader, headers)])
            raise ClientError(f"HTTP {status} from /v1/completions: {text[:500].decode('utf-8', 'replace')}")
        buf = b""
        async for piece in _body(reader, headers):
            now = time.perf_counter()
            buf = (buf + piece).replace(b"\r\n", b"\n")
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
                if not data:
                    continue
                if data == b"[DONE]":
                    return
                yield now, json.loads(data)
    finally:
        writer.close()


async def one_request(host: str, port: int, model: str, req: dict, timeout: float) -> dict:
    """Send one request (``prompt_ids``, ``max_tokens``: exactly that many tokens, EOS ignored) and
    time it: ``ttft`` and ``itl`` (seconds between tokens) as they arrived at the client."""
    n = req["max_tokens"]
    payload = {"model": model, "prompt": req["prompt_ids"], "max_tokens": n, "min_tokens": n, "ignore_eos": True,
               "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    rec = {"prompt_tokens": len(req["prompt_ids"]), "requested_tokens": n, "output_tokens": 0, "ttft": None,
           "itl": [], "error": None}
    t0 = rec["sent"] = time.perf_counter()
    last, streamed = None, 0

    async def consume():
        nonlocal last, streamed
        async for now, event in stream_completion(host, port, payload):
            if event.get("usage"):
                rec["output_tokens"] = event["usage"].get("completion_tokens", 0)
            choices = event.get("choices") or []
            if not choices:
                continue
            k = len(choices[0].get("token_ids") or []) or 1  # a piece may carry several tokens
            if last is None:
                rec["ttft"] = now - t0
                rec["itl"] += [0.0] * (k - 1)
            else:  # as the user sees them: tokens that arrive together are 0 s apart
                rec["itl"] += [now - last] + [0.0] * (k - 1)
            last, streamed = now, streamed + k

    try:
        await asyncio.wait_for(consume(), timeout)
    except (ClientError, OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    rec["latency"] = time.perf_counter() - t0
    rec["streamed_tokens"] = streamed
    if rec["error"] is None and rec["output_tokens"] != n:
        rec["error"] = f"asked for {n} tokens, the server reports {rec['output_tokens']}"
    return rec


async def run_load(host: str, port: int, model: str, requests: list[dict], concurrency: int,
                   budget_s: float, request_timeout: float) -> dict:
    """Closed-loop load: ``concurrency`` workers share ``requests`` in order; no request is sent
    after ``budget_s`` seconds. Returns the per-request records and the wall time."""
    todo = list(requests)
    records: list[dict] = []
    t0 = time.perf_counter()

    async def worker():
        while todo and time.perf_counter() - t0 < budget_s:
            records.append(await one_request(host, port, model, todo.pop(0), request_timeout))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"records": records, "wall_s": time.perf_counter() - t0, "unsent": len(todo)}


def drive(host: str, port: int, model: str, requests: list[dict], concurrency: int, budget_s: float,
          request_timeout: float) -> dict:
    """:func:`run_load` on a fresh event loop (callers are synchronous)."""
    return asyncio.run(run_load(host, port, model, requests, concurrency, budget_s, request_timeout))
