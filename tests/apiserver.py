"""A Kubernetes API emulator for tests and the local demo, over real HTTP on 127.0.0.1.

Built on kmock 0.8's KubernetesScaffold (HTTP plumbing, request parsing, discovery), with the object
semantics this project needs and stock kmock lacks: resourceVersion/uid/generation/timestamps, 409 on a
stale resourceVersion, label and field selectors on list and watch, watch resume from a resourceVersion
(410 when too old) and `timeoutSeconds`, JSON merge patch (RFC 7386, also used for strategic merge
patches: maps merge, lists replace), JSON patch (RFC 6902, 422 on a failed `test`), PUT, status
subresource isolation, the pod eviction subresource (429 while a disruption budget blocks it), and fault
injection (status codes for chosen requests, watches dropped after a while). Server-side apply and
admission are not emulated: requests for them answer 415.

Pinned to kmock==0.8: `_handle`, `Request` and `ResourceInfo` are its internals.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

Key = tuple[str, str, str]  # group, version, plural
ObjectKey = tuple[Key, str | None, str]  # resource, namespace, name
Fault = Callable[[rendering.Request], int | None]

EVENT_LOG_LIMIT = 20000

CORE_RESOURCES: dict[Key, kmock.ResourceInfo] = {
    ("", "v1", "nodes"): kmock.ResourceInfo(kind="Node", namespaced=False, verbs={"get", "list", "watch", "patch", "update", "create", "delete"}, subresources={"status"}),
    ("", "v1", "pods"): kmock.ResourceInfo(kind="Pod", namespaced=True, verbs={"get", "list", "watch", "patch", "update", "create", "delete"}, subresources={"status", "eviction"}),
    ("", "v1", "events"): kmock.ResourceInfo(kind="Event", namespaced=True, verbs={"get", "list", "watch", "create", "patch"}),
    ("", "v1", "namespaces"): kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs={"get", "list", "watch"}),
    ("events.k8s.io", "v1", "events"): kmock.ResourceInfo(kind="Event", namespaced=True, verbs={"get", "list", "watch", "create", "patch"}),
    ("kopf.dev", "v1", "clusterkopfpeerings"): kmock.ResourceInfo(kind="ClusterKopfPeering", namespaced=False, verbs={"get", "list", "watch", "patch", "create"}),
    ("kopf.dev", "v1", "kopfpeerings"): kmock.ResourceInfo(kind="KopfPeering", namespaced=True, verbs={"get", "list", "watch", "patch", "create"}),
}


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def response(self) -> aiohttp.web.Response:
        body = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "code": self.code, "reason": self.reason, "message": self.message}
        return aiohttp.web.json_response(body, status=self.code)


STATUS_REASONS = {400: "BadRequest", 404: "NotFound", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
                  422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


def injected(code: int) -> ApiError:
    return ApiError(code, STATUS_REASONS.get(code, "Injected"), f"injected fault {code}")


# ---------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902. A failed `test` or a missing path is a 422, as the API server answers."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        try:
            if op["op"] == "test":
                if _walk(doc, parts) != op["value"]:
                    raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: test failed at {op['path']}")
                continue
            if op["op"] in ("move", "copy"):
                value = copy.deepcopy(_walk(doc, _pointer(op["from"])))
                if op["op"] == "move":
                    doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
                doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
                continue
            parent, last = _walk(doc, parts[:-1]), parts[-1] if parts else None
            if op["op"] == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif op["op"] in ("add", "replace"):
                if not parts:
                    doc = copy.deepcopy(op["value"])
                elif isinstance(parent, list):
                    index = len(parent) if last == "-" else int(last)
                    if op["op"] == "add":
                        parent.insert(index, copy.deepcopy(op["value"]))
                    else:
                        parent[index] = copy.deepcopy(op["value"])
                else:
                    if op["op"] == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = copy.deepcopy(op["value"])
            else:
                raise ApiError(422, "Invalid", f"unknown JSON patch op {op['op']!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"JSON patch {op['op']} at {op['path']} failed: {exc!r}") from None
    return doc


# ---------------------------------------------------------------- selectors


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    terms.append(current.strip())
    return [t for t in terms if t]


def label_selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    for term in _split_terms(selector or ""):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            member = key in labels and labels[key] in values
            if member != (op == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_selector_matches(selector: str | None, obj: dict[str, Any]) -> bool:
    for term in _split_terms(selector or ""):
        negate = "!=" in term
        path, value = term.replace("==", "=").split("!=" if negate else "=", 1)
        actual: Any = obj
        for part in path.strip().split("."):
            actual = actual.get(part) if isinstance(actual, dict) else None
        if (str(actual if actual is not None else "") == value.strip()) == negate:
            return False
    return True


# ---------------------------------------------------------------- the emulator


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesScaffold):
    store: dict[ObjectKey, dict[str, Any]] = attrs.field(factory=dict, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)
    watch_drop_seconds: float | None = attrs.field(default=None, init=False)
    eviction_blocked: set[tuple[str, str]] = attrs.field(factory=set, init=False)
    evictions: list[dict[str, Any]] = attrs.field(factory=list, init=False)  # what each eviction saw, for invariants
    _rv: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)
    _last_rv: int = attrs.field(default=0, init=False)
    _log: dict[Key, collections.deque] = attrs.field(factory=dict, init=False)
    _changed: asyncio.Condition | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, info in CORE_RESOURCES.items():
            self.declare(key, info)

    def declare(self, key: Key, info: kmock.ResourceInfo) -> None:
        self.resources[kmock.resource(*key)] = info
        self._log.setdefault(key, collections.deque(maxlen=EVENT_LOG_LIMIT))

    # ------------------------------------------------------------ direct access for tests (no HTTP)

    def put_object(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        return self._create(key, meta.get("namespace"), copy.deepcopy(obj))

    def get_object(self, key: Key, namespace: str | None, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.store.get((key, namespace, name)))

    def objects(self, key: Key) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (k, _, _), o in sorted(self.store.items(), key=lambda i: str(i[0])) if k == key]

    def requests_for(self, key: Key, method: str | None = None) -> list[rendering.Request]:
        return [
            r for r in list(self._requests)
            if r.resource is not None and (r.resource.group, r.resource.version, r.resource.plural) == key
            and (method is None or r.method.value == method)
        ]

    # ------------------------------------------------------------ internals

    def _info(self, key: Key) -> kmock.ResourceInfo | None:
        for res, info in self.resources.items():
            if (res.group, res.version, res.plural) == key:
                return info
        return None

    def _next_rv(self) -> int:
        self._last_rv = next(self._rv)
        return self._last_rv

    def _record(self, key: Key, kind: str, obj: dict[str, Any]) -> None:
        self._log[key].append((int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj)))
        if self._changed is not None:
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    def _create(self, key: Key, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        info = self._info(key)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + uuid.uuid4().hex[:5]
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        namespace = namespace if info is None or info.namespaced else None
        if (key, namespace, name) in self.store:
            raise ApiError(409, "AlreadyExists", f'{key[2]} "{name}" already exists')
        meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_iso(), resourceVersion=str(self._next_rv()), generation=1)
        if namespace is not None:
            meta["namespace"] = namespace
        if info is not None and info.kind:
            obj.setdefault("kind", info.kind)
            obj.setdefault("apiVersion", f"{key[0]}/{key[1]}" if key[0] else key[1])
        if info is not None and "status" in info.subresources and key[0] not in ("",):
            obj.pop("status", None)  # custom resources: status only through /status
        self.store[(key, namespace, name)] = obj
        self._record(key, "ADDED", obj)
        return obj

    def _replace(self, key: Key, okey: ObjectKey, new: dict[str, Any], subresource: str | None, sent_rv: str | None) -> dict[str, Any]:
        old = self.store[okey]
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {key[2]} "{okey[2]}": the object has been modified; please apply your changes to the latest version and try again')
        info = self._info(key)
        if subresource == "status":
            new = dict(old, status=new.get("status"))
        elif info is not None and "status" in info.subresources and "status" in old:
            new = dict(new, status=old["status"])
        for field in ("uid", "creationTimestamp", "name", "namespace"):
            if field in old["metadata"]:
                new.setdefault("metadata", {})[field] = old["metadata"][field]
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        new["metadata"]["generation"] = old["metadata"].get("generation", 1)
        if new == old:
            return old  # a no-op write changes nothing, as on a real API server
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] += 1
        new["metadata"]["resourceVersion"] = str(self._next_rv())
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            del self.store[okey]
            self._record(key, "DELETED", new)
        else:
            self.store[okey] = new
            self._record(key, "MODIFIED", new)
        return new

    def _delete(self, key: Key, okey: ObjectKey) -> dict[str, Any]:
        obj = self.store[okey]
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                marked = copy.deepcopy(obj)
                marked["metadata"]["deletionTimestamp"] = now_iso()
                marked["metadata"]["resourceVersion"] = str(self._next_rv())
                self.store[okey] = marked
                self._record(key, "MODIFIED", marked)
            return self.store[okey]
        del self.store[okey]
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._record(key, "DELETED", obj)
        return obj

    def _selected(self, key: Key, request: rendering.Request) -> list[dict[str, Any]]:
        out = []
        for (k, ns, _), obj in self.store.items():
            if k != key or (request.namespace is not None and ns != request.namespace):
                continue
            if request.name is not None and obj["metadata"]["name"] != request.name:
                continue
            if self._matches(obj, request):
                out.append(obj)
        return out

    @staticmethod
    def _matches(obj: dict[str, Any], request: rendering.Request) -> bool:
        return label_selector_matches(request.params.get("labelSelector"), obj["metadata"].get("labels", {})) and \
            field_selector_matches(request.params.get("fieldSelector"), obj)

    # ------------------------------------------------------------ HTTP

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if self._changed is None:
            self._changed = asyncio.Condition()
        key = None if request.resource is None else (request.resource.group, request.resource.version, request.resource.plural)
        if key is None or self._info(key) is None or request.resource.plural is None:
            return await super()._handle(request)
        try:
            for fault in self.faults:
                code = fault(request)
                if code:
                    raise injected(code)
            return await self._serve(key, request)
        except ApiError as exc:
            return exc.response()

    async def _serve(self, key: Key, request: rendering.Request) -> aiohttp.web.StreamResponse:
        method = request.method.value.upper()
        okey: ObjectKey = (key, request.namespace, request.name or "")
        if method == "GET" and request.params.get("watch") in ("true", "1"):
            return await self._watch(key, request)
        if request.name is None:
            if method == "GET":
                items = [copy.deepcopy(o) for o in self._selected(key, request)]
                info = self._info(key)
                return aiohttp.web.json_response({
                    "apiVersion": f"{key[0]}/{key[1]}" if key[0] else key[1], "kind": f"{info.kind}List",
                    "metadata": {"resourceVersion": str(self._last_rv)}, "items": items,
                })
            if method == "POST":
                return aiohttp.web.json_response(self._create(key, request.namespace, copy.deepcopy(request.data or {})), status=201)
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
        if request.subresource == "eviction" and method == "POST":
            return self._evict(key, okey)
        if okey not in self.store:
            raise ApiError(404, "NotFound", f'{key[2]} "{request.name}" not found')
        if method == "GET":
            return aiohttp.web.json_response(copy.deepcopy(self.store[okey]))
        if method == "DELETE":
            return aiohttp.web.json_response(self._delete(key, okey))
        if method == "PUT":
            body = copy.deepcopy(request.data or {})
            return aiohttp.web.json_response(self._replace(key, okey, body, request.subresource, body.get("metadata", {}).get("resourceVersion")))
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            old = self.store[okey]
            if content_type == "application/json-patch+json":
                new, sent_rv = json_patch(old, request.data or []), None
            elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                patch = request.data or {}
                sent_rv = (patch.get("metadata") or {}).get("resourceVersion")
                new = merge_patch(old, patch)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"patch type {content_type!r} is not emulated")
            return aiohttp.web.json_response(self._replace(key, okey, new, request.subresource, sent_rv))
        raise ApiError(405, "MethodNotAllowed", method)

    def _evict(self, key: Key, okey: ObjectKey) -> aiohttp.web.Response:
        if okey not in self.store:
            raise ApiError(404, "NotFound", f'pods "{okey[2]}" not found')
        if (okey[1], okey[2]) in self.eviction_blocked:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
        pod = self.store[okey]
        node = self.store.get((("", "v1", "nodes"), None, pod.get("spec", {}).get("nodeName")))
        self.evictions.append({"at": time.time(), "pod": copy.deepcopy(pod), "node_labels": dict((node or {}).get("metadata", {}).get("labels", {}))})
        self._delete(key, okey)
        return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}, status=201)

    async def _watch(self, key: Key, request: rendering.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        loop = asyncio.get_running_loop()
        timeout = float(request.params.get("timeoutSeconds") or 3600)
        if self.watch_drop_seconds is not None:
            timeout = min(timeout, self.watch_drop_seconds)
        deadline = loop.time() + timeout
        since = request.params.get("resourceVersion")
        log = self._log[key]

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since and since != "0":
            position = int(since)
            if log and position < log[0][0] - 1 and len(log) == log.maxlen:
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                          "message": f"too old resource version: {since}"}
                await send("ERROR", status)
                return response
        else:
            position = self._last_rv
            for obj in self._selected(key, request):
                await send("ADDED", copy.deepcopy(obj))
        assert self._changed is not None
        while loop.time() < deadline:
            fresh = list(itertools.takewhile(lambda e: e[0] > position, reversed(log)))  # newest first, O(new)
            for rv, kind, obj in reversed(fresh):
                position = rv
                namespace_ok = request.namespace is None or obj["metadata"].get("namespace") == request.namespace
                name_ok = request.name is None or obj["metadata"]["name"] == request.name
                if namespace_ok and name_ok and self._matches(obj, request):
                    await send(kind, obj)
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=max(0.01, min(1.0, deadline - loop.time())))
                except asyncio.TimeoutError:
                    pass
        await response.write_eof()
        return response


class ApiServerThread:
    """The emulator on its own event loop in a background thread, for sync clients (the agent, tests)."""

    def __init__(self) -> None:
        import threading

        self.server = ApiServer()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="apiserver", daemon=True)
        self.url = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with self.server, kmock.Server(self.server) as http:
            self.url = str(http.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> "ApiServerThread":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("API emulator did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the emulator's loop (its state is not thread-safe) and return the result."""
        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(10)
