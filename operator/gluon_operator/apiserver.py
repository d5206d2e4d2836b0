"""What the API server accepts, for the webhook's choice of delivery (delivery.py): its version, and whether a
pod spec with `fileKeyRef` passes its admission and validation.

An API server without EnvFiles (older than 1.35, or the gate off) drops the field in the registry's
PrepareForCreate (k8s pkg/api/pod/util.go, dropFileKeyRefInUse), and validation then refuses the env entry
("must specify one of: ..."), so a pod injected that way would be refused. The version alone cannot tell a
gate turned off. So the operator asks the API server itself: a server-side dry run (nothing is stored) of a
PodTemplate carrying fileKeyRef, in the operator's own namespace. PodTemplates go through the same
DropDisabledTemplateFields and the same pod-spec validation, run nothing, and the chart grants the operator
`create` on them in its namespace only. The answer is cached and asked again every REFRESH_SECONDS.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from kubernetes import client

from gluon_common import contract
from gluon_common.kube import REQUEST_TIMEOUT, classify

from .world_types import ApiFacts

log = logging.getLogger("gluon_operator.apiserver")
REFRESH_SECONDS = 600.0
RETRY_SECONDS = 30.0  # after an answer that told nothing (the API down, a timeout)
CHECK_NAME = "gluon-rollout-filekeyref-check"
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def check_template() -> dict[str, Any]:
    """A PodTemplate whose only unusual field is one fileKeyRef env entry (valid where EnvFiles is on)."""
    ref = {"volumeName": "flag", "path": contract.FLAG_FILE, "key": contract.FLAG_ENV, "optional": False}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": CHECK_NAME},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "check",
                        "image": "check",
                        "env": [{"name": contract.FLAG_ENV, "valueFrom": {"fileKeyRef": ref}}],
                    }
                ],
                "volumes": [{"name": "flag", "emptyDir": {}}],
            }
        },
    }


def read_outcome(status: int | None, message: str) -> tuple[bool | None, str]:
    """(accepted, why) from the dry run's answer: 2xx accepted; 422 naming the env source refused; anything
    else (no permission, an outage, another validation error) leaves it unknown."""
    if status is not None and 200 <= status < 300:
        return True, "a dry-run pod template with fileKeyRef was accepted"
    if status == 422 and ("fileKeyRef" in message or "must specify one of" in message):
        return False, f"a dry-run pod template with fileKeyRef was refused (EnvFiles off): {message[:300]}"
    if status == 403:
        return None, f"the operator may not create pod templates in its namespace to check fileKeyRef: {message[:200]}"
    return None, f"fileKeyRef could not be checked ({status or 'no answer'}): {message[:200]}"


def own_namespace() -> str:
    """The operator's namespace: GLUON_NAMESPACE (the chart sets it from the downward API), else the service
    account's, else default."""
    if os.environ.get("GLUON_NAMESPACE"):
        return os.environ["GLUON_NAMESPACE"]
    try:
        with open(NAMESPACE_FILE) as handle:
            return handle.read().strip() or "default"
    except OSError:
        return "default"


def check(api: client.ApiClient, namespace: str) -> ApiFacts:
    """Ask the API server (two requests)."""
    try:
        version = client.VersionApi(api).get_code(_request_timeout=REQUEST_TIMEOUT).git_version
    except Exception as exc:  # noqa: BLE001 - the version is information; the dry run decides
        version = None
        log.info("the API server's version could not be read: %s", classify(exc))
    try:
        client.CoreV1Api(api).create_namespaced_pod_template(
            namespace, check_template(), dry_run="All", _request_timeout=REQUEST_TIMEOUT, _preload_content=False
        )
        accepted, reason = read_outcome(201, "")
    except Exception as exc:  # noqa: BLE001 - classified: an ApiException carries the API server's words
        failure = classify(exc)
        accepted, reason = read_outcome(failure.status, str(failure))
    return ApiFacts(version, accepted, reason)


class ApiServerFacts:
    """The cached facts, refreshed in a daemon thread (every replica keeps its own: the webhook runs on both)."""

    def __init__(self, api: client.ApiClient, namespace: str | None = None) -> None:
        self.api, self.namespace = api, namespace or own_namespace()
        self.facts = ApiFacts()
        self.stop = threading.Event()

    def start(self) -> "ApiServerFacts":
        threading.Thread(target=self._loop, name="apiserver-facts", daemon=True).start()
        return self

    def refresh(self) -> ApiFacts:
        fresh = check(self.api, self.namespace)
        if fresh != self.facts:
            log.info("API server %s: fileKeyRef %s (%s)", fresh.version, fresh.file_key_ref, fresh.reason)
        if fresh.file_key_ref is not None or self.facts.file_key_ref is None:
            self.facts = fresh  # an answer that told nothing keeps the last one that did
        return fresh

    def _loop(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            fresh = self.refresh()
            wait = REFRESH_SECONDS if fresh.file_key_ref is not None else RETRY_SECONDS
            self.stop.wait(max(1.0, wait - (time.monotonic() - started)))
