"""A fault-injecting proxy in front of the real API server, for tests and benches: plain HTTP on
127.0.0.1, forwarding every request (with the caller's own bearer token, so the API server still
authenticates, authorizes and admits it) and streaming watches through.

Faults are rules chosen per request: answer a status code instead of forwarding, delay, or cut a
watch after some seconds. Every request is recorded (method, path, query, status), so tests can count
what a client did (e.g. evictions, node patches) without the API server's help.
"""

from __future__ import annotations

import asyncio
import random
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import aiohttp.web

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}
STATUS_REASONS = {
    409: "Conflict",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True)
class Seen:
    at: float
    method: str
    path: str
    query: str
    status: int

    @property
    def watch(self) -> bool:
        return "watch=true" in self.query or "watch=1" in self.query

    @property
    def subresource(self) -> str | None:
        match = (
            re.match(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/([a-z]+)$", self.path)
            or re.match(r"^/api/v1/nodes/[^/]+/([a-z]+)$", self.path)
            or re.match(r"^/apis/[^/]+/[^/]+/namespaces/[^/]+/[^/]+/[^/]+/([a-z]+)$", self.path)
        )
        return match.group(1) if match else None


@dataclass
class Rule:
    """`match(method, path, query) -> bool`; then with `probability`: answer `status`, or wait `delay`
    seconds first, or (watches) end the stream after `cut_after` seconds."""

    match: Callable[[str, str, str], bool]
    status: int | None = None
    delay: float = 0.0
    cut_after: float | None = None
    probability: float = 1.0


@dataclass
class FaultProxy:
    upstream: str
    ca_file: str
    seed: int = 0
    rules: list[Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        self.thread.start()
        if not self._started.wait(15):
            raise RuntimeError("the fault proxy did not start within 15 s")
        return self

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests(self, method: str | None = None, pattern: str | None = None) -> list[Seen]:
        with self.lock:
            return [
                s
                for s in self.seen
                if (method is None or s.method == method) and (pattern is None or re.search(pattern, s.path))
            ]

    # ------------------------------------------------------------ serving

    def _serve(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._main())
        self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        context = ssl.create_default_context(cafile=self.ca_file)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=0), auto_decompress=False
        )
        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Streams still open at stop (a stopped client's watch) are cut after 1 s, not aiohttp's default 60.
        runner = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._started.set()
        await self._stop.wait()
        await runner.cleanup()
        await self.session.close()

    def _rule_for(self, method: str, path: str, query: str) -> Rule | None:
        for rule in self.rules:
            if rule.match(method, path, query) and self.random.random() < rule.probability:
                return rule
        return None

    def _record(self, request: aiohttp.web.Request, status: int) -> None:
        with self.lock:
            self.seen.append(Seen(time.time(), request.method, request.path, request.query_string, status))

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        rule = self._rule_for(request.method, request.path, request.query_string)
        if rule is not None and rule.delay:
            await asyncio.sleep(rule.delay)
        if rule is not None and rule.status is not None:
            self._record(request, rule.status)
            return aiohttp.web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "status": "Failure",
                    "code": rule.status,
                    "reason": STATUS_REASONS.get(rule.status, "Injected"),
                    "message": f"injected fault {rule.status}",
                },
                status=rule.status,
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        # A request without a Content-Type (the kubernetes client sends evictions so) must reach the API server
        # without one too: aiohttp would label the bytes application/octet-stream, which the API server refuses (415).
        skip = () if "Content-Type" in request.headers else ("Content-Type",)
        async with self.session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=body or None,
            skip_auto_headers=skip,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        ) as upstream:
            self._record(request, upstream.status)
            response = aiohttp.web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await response.prepare(request)
            deadline = time.monotonic() + rule.cut_after if rule is not None and rule.cut_after is not None else None
            try:
                while True:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break  # a dropped watch: the stream ends, as a load balancer's idle cut would
                    chunk = await asyncio.wait_for(upstream.content.readany(), remaining)
                    if not chunk:
                        break
                    await response.write(chunk)
            except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionResetError):
                pass
            return response


def path_is(pattern: str, method: str | None = None, watch: bool | None = None) -> Callable[[str, str, str], bool]:
    """A rule matcher: the path matches `pattern` (a regex), optionally the method and whether it is a watch."""
    regex = re.compile(pattern)

    def match(m: str, path: str, query: str) -> bool:
        is_watch = "watch=true" in query or "watch=1" in query
        return bool(regex.search(path)) and (method is None or m == method) and (watch is None or watch == is_watch)

    return match


def everything(_: str, __: str, ___: str) -> bool:
    return True
