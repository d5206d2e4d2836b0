"""kopf's webhook server with a body limit that fits every AdmissionReview the API server can send.

kopf 1.45.2 (kopf/_kits/webhooks.py, `WebhookServer.__call__`) builds its aiohttp Application with the
default `client_max_size` of 1 MiB, so a review of a larger pod was answered 413 before any handler ran.
The kube-apiserver takes request bodies up to 3 MiB (k8s.io/apiserver/pkg/server/config.go,
`MaxRequestBodyBytes`), and a review carries the object (twice for an UPDATE), so the limit here is
REVIEW_LIMIT. The hook is kopf's `_serve` (called as `self._serve(fn, request)`): the request is cloned
with the larger limit before kopf reads it (aiohttp's public `BaseRequest.clone(client_max_size=...)`).
A body past even that limit cannot come from an API server; it is counted and answered 413 (the
webhook's failurePolicy Ignore then admits the pod). A body that is not an AdmissionReview as an API server
sends one (webhook.review_problem) is counted and answered 400 with what is wrong, before kopf reads it.

kopf loads the serving certificate once, at start. The kubelet rewrites a mounted Secret in place when it
changes (cert-manager's renewal; a `helm upgrade` that renews the chart's own certificate, together with the
webhook configuration's caBundle), so CertificateReloader serves the files as they are now: at a handshake
(the context's SNI callback, called with or without a server name) it re-reads them at most every
RELOAD_CHECK_SECONDS and hands the connection a context with the new pair, without a restart.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp.web
import kopf

from . import records, webhook
from .metrics import METRICS

REVIEW_LIMIT = 8 * 1024 * 1024
RELOAD_CHECK_SECONDS = 30.0  # the kubelet updates a mounted Secret within about a minute
log = logging.getLogger("gluon_operator")


class CertificateReloader:
    """The serving certificate and key as the files hold them now (see the module docstring)."""

    def __init__(
        self,
        certfile: str,
        keyfile: str,
        check_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.certfile, self.keyfile, self.clock = certfile, keyfile, clock
        self.check_seconds = RELOAD_CHECK_SECONDS if check_seconds is None else check_seconds
        self.digest = self._digest()
        self.context = self._context()
        self.checked = clock()

    def _digest(self) -> str:
        return hashlib.sha256(Path(self.certfile).read_bytes() + Path(self.keyfile).read_bytes()).hexdigest()

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certfile, self.keyfile)
        return context

    def current(self) -> ssl.SSLContext:
        """The context of the files' pair; the one before while they are unreadable or do not match (a
        Secret caught mid-update is read again at the next check)."""
        if self.clock() - self.checked < self.check_seconds:
            return self.context
        self.checked = self.clock()
        try:
            digest = self._digest()
            if digest != self.digest:
                self.context, self.digest = self._context(), digest
                log.info("the webhook's serving certificate changed on disk: serving the new one")
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("the webhook's certificate files cannot be loaded (%s): serving the previous pair", exc)
        return self.context

    def on_handshake(self, sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: Any) -> None:
        current = self.current()
        if sock.context is not current:
            sock.context = current


class AdmissionServer(kopf.WebhookServer):
    def _build_ssl(self) -> tuple[bytes | None, ssl.SSLContext | None]:
        cadata, context = super()._build_ssl()
        if context is not None and self.certfile is not None and self.pkeyfile is not None:
            context.sni_callback = CertificateReloader(str(self.certfile), str(self.pkeyfile)).on_handshake
        return cadata, context

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        request = request.clone(client_max_size=REVIEW_LIMIT)
        try:
            body = await request.read()  # kept by aiohttp: kopf's own read gets the same bytes
        except aiohttp.web.HTTPRequestEntityTooLarge:
            METRICS.webhook_reviews.labels(webhook.TOO_LARGE).inc()
            log.warning("an admission review over %d bytes was refused unread (no API server sends one)", REVIEW_LIMIT)
            raise
        try:
            problem = webhook.review_problem(records.loads(body, max_bytes=None))
        except records.UnreadableJSON as exc:
            problem = f"the body is unreadable: {exc}"
        if problem:  # 400, as kopf answers a body that is not JSON; never a handler's traceback and a 500
            METRICS.webhook_reviews.labels(webhook.NOT_A_REVIEW).inc()
            log.warning("a request that is not an admission review was answered 400: %s", problem)
            raise aiohttp.web.HTTPBadRequest(text=f"not an AdmissionReview: {problem}\n")
        return await kopf.WebhookServer._serve(fn, request)
