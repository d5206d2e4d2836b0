"""Thin shell over the official Kubernetes client for the agent's one object: its own Node."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client, config, watch

REQUEST_TIMEOUT = (5, 15)  # connect, read seconds
MERGE_PATCH = "application/merge-patch+json"


class ApiFailure(Exception):
    """An API call that failed, classified for metrics and retry decisions."""

    def __init__(self, kind: str, status: int | None, message: str) -> None:
        super().__init__(f"{kind} ({status}): {message}" if status else f"{kind}: {message}")
        self.kind, self.status = kind, status

    @property
    def retryable(self) -> bool:
        return self.kind in ("conflict", "server", "throttled", "timeout", "connection", "expired")


def classify(exc: Exception) -> ApiFailure:
    if isinstance(exc, ApiFailure):
        return exc
    if isinstance(exc, client.ApiException):
        status = exc.status or 0
        kind = {409: "conflict", 410: "expired", 429: "throttled"}.get(status) or (
            "server" if status >= 500 else "client"
        )
        reason = exc.reason or ""
        try:
            reason = json.loads(exc.body or "{}").get("message") or reason
        except (ValueError, AttributeError):
            pass
        return ApiFailure(kind, status, reason)
    if isinstance(exc, (urllib3.exceptions.TimeoutError, TimeoutError)):
        return ApiFailure("timeout", None, str(exc))
    if isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, OSError)):
        return ApiFailure("connection", None, str(exc))
    return ApiFailure("unexpected", None, f"{type(exc).__name__}: {exc}")


def make_api_client(api_url: str | None = None, kubeconfig: str | None = None) -> client.ApiClient:
    """An explicit URL (tests, development), a kubeconfig, or the in-cluster service account."""
    if api_url:
        configuration = client.Configuration()
        configuration.host = api_url
        return client.ApiClient(configuration)
    if kubeconfig or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return config.new_client_from_config(config_file=kubeconfig)
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


class NodeApi:
    """Reads, patches and watches exactly one Node: the one this agent runs on."""

    def __init__(self, api_client: client.ApiClient, node_name: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self.name = node_name

    def read(self) -> dict[str, Any]:
        try:
            response = self.core.read_node(self.name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
            return json.loads(response.data)
        except Exception as exc:
            raise classify(exc) from exc

    def patch(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self.core.patch_node(
                self.name, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            return json.loads(response.data)
        except Exception as exc:
            raise classify(exc) from exc

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """One pod by name (the preflight that asks for its flag): `get` only, never a list of pods."""
        try:
            response = self.core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            return json.loads(response.data)
        except Exception as exc:
            raise classify(exc) from exc

    def watch(self, resource_version: str | None, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        stream = watch.Watch().stream(
            self.core.list_node,
            field_selector=f"metadata.name={self.name}",
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            _request_timeout=(REQUEST_TIMEOUT[0], timeout_seconds + 10),
        )
        try:
            for event in stream:
                yield event["type"], event["raw_object"]
        except Exception as exc:
            raise classify(exc) from exc
