"""`gluon-agent run`: the per-node daemon. Thin shell around `decisions`: it probes, self-tests (in a
worker thread; the GPU work itself runs in child processes), publishes labels and the report on its own
Node, watches that Node, and serves /metrics, /healthz, /readyz and /v1/decision."""

from __future__ import annotations

import json
import logging
import random
import signal
import sys
import threading
import time
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gluon_common import contract
from gluon_common.backoff import backoff
from gluon_common.delivery import DeliveryReport
from gluon_common.kube import ApiFailure, NodeApi
from gluon_common.report import REPORT_SCHEMA_VERSION, AgentReport, LastAttempt, Probe, SelfTest
from gluon_common.sglang_routes import DEFAULT_SERVING, ServingConfig

from . import __version__, decisions, delivery, isolation, selftest_pod
from .fingerprint import fingerprint, fingerprint_parts
from .metrics import AgentMetrics
from .sources import ResultSource

log = logging.getLogger("gluon_agent")


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    host: str = "0.0.0.0"
    port: int = contract.AGENT_PORT
    period: float = 24 * 3600.0  # periodic re-test
    jitter: float = 0.1  # +-10% on the period, so a fleet does not test at once
    probe_interval: float = 600.0  # how often to re-probe for a changed fingerprint
    retry_base: float = 60.0  # deferral back-off start
    retry_cap: float = 3600.0
    max_view_age: float = 90.0  # the decision endpoint answers '0' past this
    watch_timeout: int = 30
    tick: float = 1.0
    publish_attempts: int = 8
    api_backoff_base: float = 0.5
    api_backoff_cap: float = 30.0
    observe_interval: float = delivery.DEFAULT_INTERVAL  # how often the delivery observation is read
    image_proofs: bool = False  # '1' only for a pod whose own image this node proved (selfTest.inServingImage)
    image_wait: float = 3.0  # how long to wait for the kubelet to report the asking preflight's image


# ---------------------------------------------------------------- report building (pure)


def selftest_summary(report: Mapping[str, Any], trigger: str, fingerprint: str | None = None) -> SelfTest:
    """The self-test report, cut to what the operator and a person need on the Node (annotations are
    small); the full report stays in the agent's log and metrics. `fingerprint`: the one the verdict is
    published for, when not the report's own. The cut is selftest_pod's, which self-test pods write too."""
    return SelfTest.model_validate(selftest_pod.selftest_summary(report, trigger, fingerprint))


def node_report(
    node: str,
    probe: Mapping[str, Any],
    fp: str,
    selftest: SelfTest | None,
    verdict: str,
    last_attempt: LastAttempt | None,
) -> AgentReport:
    return AgentReport(
        schema_version=REPORT_SCHEMA_VERSION,
        agent_version=__version__,
        node=node,
        fingerprint=fp,
        fingerprint_parts=fingerprint_parts(dict(probe)),
        verdict=verdict,
        probe=Probe.model_validate(selftest_pod.probe_summary(probe)),
        selftest=selftest,
        last_attempt=last_attempt,
    )


def parse_serving_config(raw: str | None) -> tuple[ServingConfig, str | None]:
    """(the config to test, why the annotation was not used): the default while there is none."""
    if raw is None:
        return DEFAULT_SERVING, None
    try:
        return ServingConfig.from_dict(json.loads(raw), contract.ANNOTATION_SERVING_CONFIG), None
    except ValueError as exc:  # JSONDecodeError is one
        return DEFAULT_SERVING, f"{exc} ({raw[:100]!r})"


def restore(node: Mapping[str, Any] | None, fp: str) -> tuple[str | None, SelfTest | None, str | None]:
    """(verdict, selftest summary, problem) from a report this agent published earlier for the same
    fingerprint, so a restarted agent does not fall back to 'pending' while it tests again."""
    raw = ((node or {}).get("metadata", {}).get("annotations") or {}).get(contract.ANNOTATION_REPORT)
    if not raw:
        return None, None, None
    try:
        report = AgentReport.model_validate_json(raw)
    except ValueError as exc:  # pydantic's ValidationError is one
        return None, None, f"{contract.ANNOTATION_REPORT} is not our JSON report ({exc}): {raw[:100]!r}"
    if report.fingerprint != fp or report.verdict not in decisions.CONCLUSIVE:
        return None, None, None
    return report.verdict, report.selftest, None


# ---------------------------------------------------------------- the node view (watch)


class WatchedNode:
    """The agent's view of its Node from its own watch; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._node: dict[str, Any] | None = None
        self._seen_at: float | None = None
        self._clock = clock

    def set(self, node: dict[str, Any] | None) -> None:
        with self._lock:
            self._node, self._seen_at = node, self._clock()

    def touch(self) -> None:
        """The watch ended normally: what we hold is still current."""
        with self._lock:
            if self._node is not None:
                self._seen_at = self._clock()

    def snapshot(self) -> tuple[dict[str, Any] | None, float | None]:
        with self._lock:
            age = None if self._seen_at is None else self._clock() - self._seen_at
            return self._node, age


def watch_node(
    api: NodeApi,
    view: WatchedNode,
    stop: threading.Event,
    config: AgentConfig,
    metrics: AgentMetrics,
    rng: random.Random,
) -> None:
    """List, then watch from that resourceVersion; reconnect on any end, relist on 410, back off on errors."""
    failures = 0
    while not stop.is_set():
        try:
            node = api.read()
            view.set(node)
            version = node["metadata"].get("resourceVersion")
            for kind, obj in api.watch(version, config.watch_timeout):
                view.set(None if kind == "DELETED" else obj)
                if stop.is_set():
                    return
            view.touch()
            failures = 0
        except ApiFailure as failure:
            metrics.api_errors.labels(failure.kind).inc()
            log.warning("node watch: %s", failure)
            failures += 1
            stop.wait(backoff(failures, config.api_backoff_base, config.api_backoff_cap, rng))


# ---------------------------------------------------------------- the agent


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        api: NodeApi,
        source: ResultSource,
        metrics: AgentMetrics | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        observation: delivery.Observation | None = None,
    ) -> None:
        self.config, self.api, self.source = config, api, source
        self.observation = observation or delivery.NoObservation()
        self.delivery: DeliveryReport | None = None
        self.delivery_read_at = -float("inf")
        self.metrics = metrics or AgentMetrics()
        self.rng = rng or random.Random()
        self.clock = clock
        self.stop = threading.Event()
        self.view = WatchedNode()
        self.schedule = decisions.Schedule()
        self.probe_report: dict[str, Any] | None = None
        self.fingerprint: str | None = None
        self.probed_at = 0.0
        self.verdict = "pending"
        self.verdict_fingerprint: str | None = None
        self.selftest: SelfTest | None = None
        self.last_attempt: LastAttempt | None = None
        self.running: Future | None = None
        self.running_trigger = ""
        self.running_request: str | None = None
        self.running_serving: str | None = None
        self.last_serving_problem: str | None = None
        self.published_once = False
        self.heartbeat = time.monotonic()
        self.retry_publish_at = 0.0
        self.last_request_problem: str | None = None  # logged once per distinct malformed value
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="selftest")
        self.http: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ facts

    def refresh_probe(self, now: float) -> None:
        if self.probe_report is not None and now - self.probed_at < self.config.probe_interval:
            return
        self.probe_report = self.source.probe()
        self.probed_at = now
        self.fingerprint = fingerprint(self.probe_report)
        self.metrics.observe_probe(self.probe_report, self.fingerprint)

    def request_token(self) -> str | None:
        node, _ = self.view.snapshot()
        raw = ((node or {}).get("metadata", {}).get("annotations") or {}).get(contract.ANNOTATION_SELFTEST_REQUEST)
        token, problem = decisions.valid_request_token(raw)
        if problem and problem != self.last_request_problem:
            self.last_request_problem = problem
            self.metrics.malformed.labels(contract.ANNOTATION_SELFTEST_REQUEST).inc()
            log.warning("ignoring a malformed self-test request: %s", problem)
        return token

    def serving_config(self) -> ServingConfig:
        """The serving config the operator wrote on this node (contract.ANNOTATION_SERVING_CONFIG), or the
        default until it has; a malformed one is counted, logged once, and the default tested."""
        node, _ = self.view.snapshot()
        raw = ((node or {}).get("metadata", {}).get("annotations") or {}).get(contract.ANNOTATION_SERVING_CONFIG)
        config, problem = parse_serving_config(raw)
        if problem and problem != self.last_serving_problem:
            self.metrics.malformed.labels(contract.ANNOTATION_SERVING_CONFIG).inc()
            log.warning("ignoring a malformed serving config: %s", problem)
        self.last_serving_problem = problem
        return config

    def desired(self) -> decisions.Desired:
        assert self.probe_report is not None and self.fingerprint is not None
        report = node_report(
            self.config.node_name, self.probe_report, self.fingerprint, self.selftest, self.verdict, self.last_attempt
        )
        observed = delivery.annotation(self.delivery) if self.delivery is not None else None
        return decisions.desired_state(self.probe_report, self.verdict, report.annotation_value(), observed)

    def refresh_delivery(self, now: float) -> None:
        """The flag each injected serving container of this node runs (delivery.py), every observe_interval;
        a mismatch with what its preflight wrote is logged once per container."""
        if now - self.delivery_read_at < self.config.observe_interval and now >= self.delivery_read_at:
            return
        self.delivery_read_at = now
        fresh, unreadable = self.observation.read(now)
        before = {(c.key, c.container_id) for c in delivery.mismatched(self.delivery)} if self.delivery else set()
        self.delivery = delivery.with_since(self.delivery, fresh, now)
        self.metrics.observe_delivery(self.delivery, unreadable, delivery.counts(self.delivery))
        for container in delivery.mismatched(self.delivery):
            if (container.key, container.container_id) not in before:
                log.warning(
                    "flag delivery mismatch: pod %s container %s runs %s (value %r) where its preflight wrote %r",
                    container.pod_uid,
                    container.container,
                    "/".join(container.runs),
                    container.delivered,
                    container.intended,
                )

    # ------------------------------------------------------------ self-test

    def start_selftest(
        self, now: float, reason: str, request: str | None, serving: ServingConfig = DEFAULT_SERVING
    ) -> None:
        log.info("self-test starting: %s (serving config %s)", reason, serving.digest)
        assert self.probe_report is not None
        probe_report = dict(self.probe_report)
        self.running_trigger, self.running_request, self.running_serving = reason, request, serving.digest
        self.running = self._worker.submit(self.source.selftest, probe_report, serving)

    def collect_selftest(self, now: float) -> None:
        assert self.running is not None and self.fingerprint is not None
        try:
            report = self.running.result()
        except Exception as exc:  # a broken source is an error verdict, never a dead agent
            log.exception("self-test crashed")
            report = {
                "result": "error",
                "problems": [f"self-test raised {type(exc).__name__}: {exc}"],
                "gpus": [],
                "finished_at": self.clock(),
                "seconds": 0,
            }
        self.running = None
        self.metrics.observe_selftest(report)
        result = report.get("result", "error")
        summary = selftest_summary(report, self.running_trigger, self.fingerprint)
        merged = decisions.merge_verdict(self.verdict, self.verdict_fingerprint, result, self.fingerprint)
        if merged == result:
            self.verdict, self.verdict_fingerprint, self.selftest = result, self.fingerprint, summary
            self.last_attempt = None
        else:
            self.last_attempt = LastAttempt(
                result=result, at=summary.tested_at, problems=summary.problems, gpus=summary.gpus
            )
        log.info("self-test %s (published verdict %s)", result, self.verdict)
        self.schedule = decisions.after_run(
            self.schedule,
            now,
            self.fingerprint,
            self.running_request,
            result,
            self.config.period,
            self.config.jitter,
            self.config.retry_base,
            self.config.retry_cap,
            self.rng,
            self.running_serving,
        )

    # ------------------------------------------------------------ publishing

    def publish(self) -> bool:
        """Make the node carry our desired keys. 409: re-read and plan again; 5xx, 429, timeouts:
        back off with jitter; gives up after a bounded number of attempts (the next tick retries)."""
        desired = self.desired()
        for attempt in range(self.config.publish_attempts):
            try:
                node = self.api.read()
                plan = decisions.plan_node_patch(node, desired)
                for problem in plan.problems:
                    self.metrics.malformed.labels(contract.ANNOTATION_OWNED_KEYS).inc()
                    log.warning("publish: %s", problem)
                if plan.patch is not None:
                    with self.metrics.publish_seconds.time():
                        self.api.patch(plan.patch)
                self.published_once = True
                return True
            except ApiFailure as failure:
                self.metrics.api_errors.labels(failure.kind).inc()
                log.warning("publish attempt %d: %s", attempt + 1, failure)
                if not failure.retryable or self.stop.is_set():
                    return False
                if failure.kind != "conflict":
                    self.stop.wait(
                        backoff(attempt, self.config.api_backoff_base, self.config.api_backoff_cap, self.rng)
                    )
        return False

    def node_matches_desired(self) -> bool:
        node, _ = self.view.snapshot()
        if node is None:
            return False
        return decisions.plan_node_patch(node, self.desired()).patch is None

    # ------------------------------------------------------------ the loop

    def restore_from_node(self) -> None:
        assert self.fingerprint is not None
        try:
            node = self.api.read()
        except ApiFailure as failure:
            self.metrics.api_errors.labels(failure.kind).inc()
            return
        if self.view.snapshot()[0] is None:
            # Until the watch's first event the view is this read: the first self-test is of the serving config
            # the operator wrote on the node, not the default. A restarted agent that proved the default first
            # published "proved another config" for its flag-on node, which the operator disabled at once, and
            # enabled again once the re-test passed: two restarts of its serving pods for an agent restart.
            self.view.set(node)
        verdict, summary, problem = restore(node, self.fingerprint)
        if problem:
            self.metrics.malformed.labels(contract.ANNOTATION_REPORT).inc()
            log.warning("not restoring: %s", problem)
        if verdict:
            self.verdict, self.verdict_fingerprint, self.selftest = verdict, self.fingerprint, summary
            log.info("restored verdict %s for fingerprint %s", verdict, self.fingerprint)

    def tick(self) -> None:
        now = self.clock()
        self.refresh_probe(now)
        self.refresh_delivery(now)
        assert self.fingerprint is not None
        if self.running is not None and self.running.done():
            self.collect_selftest(now)
            self.retry_publish_at = 0.0
        if self.running is None:
            request = self.request_token()
            serving = self.serving_config()
            reason = decisions.retest_reason(self.schedule, now, self.fingerprint, request, serving.digest)
            if reason:
                if self.verdict_fingerprint != self.fingerprint and self.verdict != "pending":
                    self.verdict, self.selftest = "pending", None  # the old verdict is for other software
                self.start_selftest(now, reason, request, serving)
        if (not self.published_once or not self.node_matches_desired()) and now >= self.retry_publish_at:
            if not self.publish():
                self.retry_publish_at = now + self.config.api_backoff_cap / 4
        self.heartbeat = time.monotonic()

    def run(self) -> None:
        watcher = threading.Thread(
            target=watch_node,
            name="node-watch",
            daemon=True,
            args=(self.api, self.view, self.stop, self.config, self.metrics, self.rng),
        )
        server = self.http = serve(self)
        threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
        log.info(
            "agent %s on node %s, serving on %s:%d", __version__, self.config.node_name, *server.server_address[:2]
        )
        try:
            self.refresh_probe(self.clock())
            self.restore_from_node()
            watcher.start()
            while not self.stop.is_set():
                self.tick()
                self.stop.wait(self.config.tick)
        finally:
            isolation.kill_all()  # self-test children die with us, never orphaned on the GPU
            self._worker.shutdown(wait=False, cancel_futures=True)
            server.shutdown()
            log.info("agent stopped")

    # ------------------------------------------------------------ HTTP answers

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < max(30.0, 10 * self.config.tick)

    def decision(self, asking: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The flag for the asking preflight; `asking`: its pod (namespace, name, uid), which decides when this
        node's proofs are per image (config.image_proofs)."""
        node, age = self.view.snapshot()
        labels = (node or {}).get("metadata", {}).get("labels") or {} if node else None
        capable = bool(self.probe_report and self.probe_report.get("capable"))
        answer = decisions.flag_decision(labels, age, self.config.max_view_age, self.verdict, capable)
        if self.config.image_proofs:
            digest, problem = self.asking_image(asking or {}) if answer["flag"] == "1" else (None, "")
            annotations = (node or {}).get("metadata", {}).get("annotations") or {}
            answer = decisions.image_decision(answer, annotations, digest, problem)
        return answer | {
            "node": self.config.node_name,
            "fingerprint": self.fingerprint,
            "selftest": self.verdict,
            "view_age_seconds": None if age is None else round(age, 3),
        }

    def asking_image(self, asking: Mapping[str, str]) -> tuple[str | None, str]:
        """The digest the asking preflight's image resolved to on this node, read from its pod's status (the
        kubelet writes it a moment after the container starts: waited for, up to config.image_wait)."""
        namespace, name = asking.get("namespace"), asking.get("name")
        if not namespace or not name:
            return None, "the preflight did not say which pod it is (an older webhook?)"
        deadline = time.monotonic() + self.config.image_wait
        while True:
            try:
                pod = self.api.read_pod(namespace, name)
            except ApiFailure as failure:
                return None, f"reading pod {namespace}/{name} failed: {failure}"
            digest, problem = decisions.asking_pod_image(
                pod, asking.get("uid"), self.config.node_name, contract.PREFLIGHT_CONTAINER
            )
            if digest is not None or time.monotonic() >= deadline:
                return digest, problem
            time.sleep(0.25)


class Handler(BaseHTTPRequestHandler):
    agent: Agent  # set on the subclass made in serve()
    timeout = 10.0  # per connection (socket timeout): an idle or silent client is dropped; probes take ms
    server_version = "gluon-agent"  # no Python version in the Server header

    def version_string(self) -> str:
        return self.server_version

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?")[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.agent.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok = self.agent.healthy()
            self._json(200 if ok else 503, {"ok": ok})
        elif path == "/readyz":
            ok = self.agent.published_once
            self._json(200 if ok else 503, {"ok": ok, "published": ok})
        elif path == contract.DECISION_PATH:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            answer = self.agent.decision({key: values[0] for key, values in query.items() if values})
            self._json(200 if answer["current"] else 503, answer)
        else:
            self._json(404, {"error": f"no such path {path}"})

    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: debug only
        log.debug("http: " + format, *args)


class AgentHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 dropped a kubelet probe in a scrape burst

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a probe timing out, a scraper restarting) is routine, not a traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            log.debug("http: %s went away: %s", client_address, error)
            return
        log.warning("http: error serving %s", client_address, exc_info=True)


def serve(agent: Agent, idle_timeout: float = Handler.timeout) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"agent": agent, "timeout": idle_timeout})
    return AgentHTTPServer((agent.config.host, agent.config.port), handler)


def install_signal_handlers(agent: Agent) -> None:
    """SIGTERM/SIGINT end the loop after the current step (a write in flight completes)."""

    def handle(signum: int, frame: Any) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        agent.stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
