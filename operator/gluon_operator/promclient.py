"""An async Prometheus HTTP API client: /api/v1/query and /api/v1/query_range, with timeouts, retries
with jittered back-off on 5xx and connection errors, bearer token and CA options, and errors that quote
the query and Prometheus's own message."""

from __future__ import annotations

import asyncio
import random
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp


class PrometheusError(Exception):
    def __init__(self, query: str, kind: str, message: str) -> None:
        super().__init__(f"Prometheus {kind} for query {query!r}: {message}")
        self.query, self.kind, self.message = query, kind, message


@dataclass
class PrometheusClient:
    url: str
    token: str | None = None
    ca_file: str | None = None
    timeout: float = 10.0
    retries: int = 2
    backoff: float = 0.5

    def _ssl(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None

    async def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        return await self._get("/api/v1/query", promql, params)

    async def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return await self._get("/api/v1/query_range", promql, params)

    async def _get(self, path: str, promql: str, params: dict[str, str]) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        last: PrometheusError | None = None
        for attempt in range(self.retries + 1):
            try:
                async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
                    async with session.get(self.url.rstrip("/") + path, params=params, ssl=self._ssl()) as response:
                        body = await response.json(content_type=None)
                        if response.status >= 500:
                            raise PrometheusError(promql, f"server error {response.status}", str(body.get("error", body))[:500])
                        if body.get("status") != "success":
                            # 4xx: a bad query or a bad parameter; retrying will not help.
                            raise PrometheusError(promql, body.get("errorType", f"error {response.status}"), str(body.get("error"))[:500])
                        return body["data"]["result"]
            except PrometheusError as exc:
                if not exc.kind.startswith("server error"):
                    raise
                last = exc
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                last = PrometheusError(promql, "unreachable", f"{type(exc).__name__}: {exc}"[:500])
            if attempt < self.retries:
                await asyncio.sleep(self.backoff * 2 ** attempt * (0.5 + random.random() / 2))
        assert last is not None
        raise last

