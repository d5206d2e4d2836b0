"""What the harness's watchers and simulators share: threads that run while a `with` block does, and
Kubernetes' list-then-watch loop (the operator's own caches are gluon_operator.informer, with paging
and back-off; these are test and bench helpers on small or admin-listed sets)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """Threads started on entering a `with` block; on leaving it, told to stop (stop_event) and joined."""

    join_seconds = 10.0

    def __init__(self, *targets: tuple[str, Callable[[], None]]) -> None:
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=target, name=name, daemon=True) for name, target in targets]

    def __enter__(self) -> Any:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(self.join_seconds)


def list_then_watch(
    list_call: Callable[..., Any],
    on_list: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[str, dict[str, Any]], None],
    stop_event: threading.Event,
    retry_seconds: float = 0.5,
) -> None:
    """List, then watch from the list's resourceVersion (5 s watches, bookmarks) until stop_event is set;
    on_list gets the listed objects, on_event every ADDED, MODIFIED or DELETED object. A failure (410
    Gone, a dropped stream) lists again after retry_seconds."""
    from kubernetes import watch

    version = None
    while not stop_event.is_set():
        try:
            if version is None:
                listing = json.loads(list_call(_preload_content=False).data)
                version = listing["metadata"]["resourceVersion"]
                on_list(listing["items"])
            for event in watch.Watch().stream(
                list_call,
                resource_version=version,
                timeout_seconds=5,
                allow_watch_bookmarks=True,
                _preload_content=False,
            ):
                raw = event["raw_object"]
                version = raw.get("metadata", {}).get("resourceVersion", version)
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    on_event(event["type"], raw)
                if stop_event.is_set():
                    return
        except Exception as exc:  # noqa: BLE001 - 410 Gone and dropped connections: list again
            log.debug("list-then-watch: %s", exc)
            version = None
            stop_event.wait(retry_seconds)
