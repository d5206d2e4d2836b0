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
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp.web
import kopf

from . import records, webhook
from .metrics import METRICS

REVIEW_LIMIT = 8 * 1024 * 1024
log = logging.getLogger("gluon_operator")


class AdmissionServer(kopf.WebhookServer):
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
