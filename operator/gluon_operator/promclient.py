"""An async Prometheus HTTP API client: /api/v1/query and /api/v1/query_range, with timeouts, retries
with jittered back-off on 5xx and connection errors, bearer token and CA options, and errors that quote
the query and Prometheus's own message. Every failure, including answers of the wrong shape and a
missing CA file, is a PrometheusError."""

from __future__ import annotations

import asyncio
import os
import random
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp


class PrometheusError(Exception):
    def __init__(self, query: str, kind: str, message: str) -> None:
        # The reason first, the query after it: a status line is read from the left.
        super().__init__(f"Prometheus {kind}: {message} (query {query!r})")
        self.query, self.kind, self.message = query, kind, message


def base_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) with the default port filled in: how trusted URLs are compared."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme, 0)
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def is_trusted(url: str, trusted: str | None) -> bool:
    """True when `url` is one of the comma-separated base URLs the cluster admin configured."""
    wanted = base_url(url)
    return any(base_url(item) == wanted for item in (trusted or "").split(",") if item.strip())


@dataclass
class PrometheusClient:
    url: str
    token: str | None = None
    ca_file: str | None = None
    timeout: float = 10.0
    retries: int = 2
    backoff: float = 0.5

    def _ssl(self, promql: str) -> ssl.SSLContext | None:
        if not self.ca_file or not self.url.lower().startswith("https:"):
            return None
        if not os.path.isfile(self.ca_file):
            raise PrometheusError(
                promql,
                "tls configuration",
                f"the CA file {self.ca_file} does not exist (the chart mounts "
                "prometheusAuth's Secret as optional: give it a ca.crt key, or use a trusted http URL)",
            )
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise PrometheusError(
                promql, "tls configuration", f"the CA file {self.ca_file} is not usable: {exc}"
            ) from None

    async def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        return await self._get("/api/v1/query", promql, params)

    async def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return await self._get("/api/v1/query_range", promql, params)

    async def _get(self, path: str, promql: str, params: dict[str, str]) -> list[dict[str, Any]]:
        if urlsplit(self.url).scheme.lower() not in ("http", "https"):
            raise PrometheusError(promql, "bad url", f"{self.url!r} is not an http or https URL")
        context = self._ssl(promql)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        last: PrometheusError | None = None
        for attempt in range(self.retries + 1):
            try:
                async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
                    async with session.get(self.url.rstrip("/") + path, params=params, ssl=context) as response:
                        return _result(promql, response.status, await _json(promql, response))
            except PrometheusError as exc:
                if not exc.kind.startswith("server error"):
                    raise
                last = exc
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                last = PrometheusError(promql, "unreachable", f"{type(exc).__name__}: {exc}"[:500])
            if attempt < self.retries:
                await asyncio.sleep(self.backoff * 2**attempt * (0.5 + random.random() / 2))
        assert last is not None
        raise last


async def _json(promql: str, response: aiohttp.ClientResponse) -> Any:
    try:
        return await response.json(content_type=None)
    except ValueError as exc:  # not JSON: a proxy's HTML page, a truncated body
        kind = f"server error {response.status}" if response.status >= 500 else "bad response"
        raise PrometheusError(promql, kind, f"HTTP {response.status}, body is not JSON: {exc}"[:500]) from None


def _result(promql: str, status: int, body: Any) -> list[dict[str, Any]]:
    """data.result of a success answer; anything else is a PrometheusError naming what is wrong."""
    if status >= 500:
        message = body.get("error", body) if isinstance(body, dict) else body
        raise PrometheusError(promql, f"server error {status}", str(message)[:500])
    if not isinstance(body, dict):
        raise PrometheusError(
            promql, "bad response", f"HTTP {status}, the answer is JSON {type(body).__name__}, not an object"
        )
    if body.get("status") != "success":
        # 4xx: a bad query or a bad parameter; retrying will not help.
        raise PrometheusError(promql, str(body.get("errorType") or f"error {status}"), str(body.get("error"))[:500])
    data = body.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PrometheusError(promql, "bad response", "status success without a data.result list")
    return data["result"]
