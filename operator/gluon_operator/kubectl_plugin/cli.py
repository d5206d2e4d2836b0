"""`kubectl gluon` (the console script `kubectl-gluon`): the thin shell. It reads objects with the user's
kubeconfig, hands them to views/controls (pure) and sends the patches they build.

Exit codes as kubectl's: 0 done (also a watch ended with Ctrl-C), 1 an error (missing rollout or node, nothing
to promote or retry, an API error), 2 a usage error.

Light on purpose (a plugin a person runs many times a minute): no statistics stack, kopf or aiohttp is
imported here or by what it imports (tests/test_kubectl_plugin.py checks; bench/plugin_start.py times it)."""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Sequence, TextIO

from gluon_common import contract
from gluon_common.kube import MERGE_PATCH

from .. import __version__, records
from ..spec import GROUP, PLURAL, VERSION
from ..world import AGENT_LABEL
from . import controls, views
from .views import PluginError

REQUEST_TIMEOUT = 30
OUTPUTS = ("wide", "json", "yaml")
DEFAULT_AGENT_SELECTOR = AGENT_LABEL  # the agent pods, as the operator finds them


class Cluster:
    """The API calls the commands need, returning raw objects (dicts as the API server sends them)."""

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
        from kubernetes import client, config

        try:
            self.api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
            self.namespace = namespace or context_namespace(kubeconfig, context)
        except (config.ConfigException, OSError) as exc:
            raise PluginError(
                f"cannot load the kubeconfig ({kubeconfig or 'KUBECONFIG or ~/.kube/config'}): {exc}"
            ) from exc
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client import ApiException

        try:
            response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
            return records.loads(response.data, max_bytes=records.PAGE_BYTES_LIMIT)
        except ApiException as exc:
            raise PluginError(api_problem(what, exc.status, exc.body)) from exc
        except Exception as exc:  # urllib3's connection and timeout errors
            raise PluginError(
                f"cannot reach the API server at {self.api_client.configuration.host} ({what}): {exc}"
            ) from exc

    def rollout(self, name: str | None, namespace: str | None = None) -> dict[str, Any]:
        if name:
            namespace = namespace or self.namespace
            return self._call(
                f"GluonRollout {name!r} in namespace {namespace!r}",
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
            )
        listed = self._call(
            f"GluonRollouts in namespace {self.namespace!r}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
        )
        return only_rollout(listed.get("items") or [], self.namespace)

    def all_rollouts(self) -> list[dict[str, Any]]:
        listed = self._call(
            "GluonRollouts in all namespaces", self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL
        )
        return sorted(
            listed.get("items") or [], key=lambda r: (views.meta(r).get("namespace"), views.meta(r).get("name"))
        )

    def watch_rollouts(self, name: str | None, all_namespaces: bool) -> Iterator[tuple[str, dict[str, Any]]]:
        """("LIST", list) then each watch event (type, object) of the rollouts `status` shows: one watch
        on GluonRollouts (a field selector for a named one), listed afresh when it expires or is gone (410)."""
        from kubernetes import watch
        from kubernetes.client import ApiException

        fields = {"field_selector": f"metadata.name={name}"} if name else {}
        if all_namespaces:
            call, args = self.custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL)
        else:
            call, args = self.custom.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, PLURAL)
        while True:
            listed = self._call("GluonRollouts", call, *args, **fields)
            yield "LIST", listed
            try:
                stream = watch.Watch().stream(
                    call, *args, resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=300, **fields
                )
                for event in stream:
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(event.get("object"), dict):
                        yield event["type"], event["object"]
            except ApiException as exc:
                if exc.status != 410:
                    raise PluginError(api_problem("watching GluonRollouts", exc.status, exc.body)) from exc

    def patch_rollout(self, rollout: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
        name = views.meta(rollout)["name"]
        return self._call(
            views.rollout_ref(rollout),
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            views.meta(rollout).get("namespace") or self.namespace,
            PLURAL,
            name,
            body,
            _content_type=MERGE_PATCH,
        )

    def node(self, name: str) -> dict[str, Any]:
        return self._call(f"node {name!r}", self.core.read_node, name)

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("nodes", self.core.list_node).get("items") or []

    def patch_node(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(f"node {name!r}", self.core.patch_node, name, body, _content_type=MERGE_PATCH)

    def serving_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The pods of one namespace (the rollout's; default the command's), or of all with namespace "*"."""
        namespace = namespace or self.namespace
        if namespace == "*":
            return self._call("pods in all namespaces", self.core.list_pod_for_all_namespaces).get("items") or []
        return (
            self._call(f"pods in namespace {namespace!r}", self.core.list_namespaced_pod, namespace).get("items") or []
        )

    def agent_pods(self, selector: str) -> list[dict[str, Any]]:
        return (
            self._call(f"agent pods ({selector})", self.core.list_pod_for_all_namespaces, label_selector=selector).get(
                "items"
            )
            or []
        )


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace kubectl would use: the context's own, else "default"."""
    from kubernetes import config

    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    if context and chosen is None:
        raise PluginError(f"context {context!r} is not in the kubeconfig")
    return ((chosen or {}).get("context") or {}).get("namespace") or "default"


def api_problem(what: str, status: int | None, body: Any) -> str:
    """kubectl-like wording for an API error, naming the object."""
    try:
        message = records.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    if status == 404:
        return f"{what} not found" + (f" ({message})" if message and "not found" not in message else "")
    if status == 403:
        return f"forbidden: {what}: {message or 'no permission'}"
    if status == 409:
        return f"conflict on {what}: it changed since it was read ({message}); run the command again"
    return f"{what}: the API server answered {status}: {message or body}"


def only_rollout(items: Sequence[Mapping[str, Any]], namespace: str) -> dict[str, Any]:
    if not items:
        raise PluginError(f"no GluonRollout in namespace {namespace!r} (use -n NAMESPACE, or name the rollout)")
    if len(items) > 1:
        names = ", ".join(sorted(views.meta(i).get("name", "?") for i in items))
        raise PluginError(f"namespace {namespace!r} has {len(items)} GluonRollouts ({names}): name one")
    return dict(items[0])


# ---------------------------------------------------------------- commands


def emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str], out: TextIO | None = None) -> None:
    """-o json|yaml: the data whole, for scripts; otherwise the text for a person."""
    out = out or sys.stdout
    if args.output == "json":
        out.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    elif args.output == "yaml":
        import yaml

        out.write(yaml.safe_dump(records.loads(json.dumps(data, default=str), max_bytes=None), sort_keys=True))
    else:
        out.write(text(data))


def status_views(cluster: Cluster, rollouts: Sequence[Mapping[str, Any]], all_namespaces: bool) -> list[dict[str, Any]]:
    if not rollouts:
        return []
    nodes = cluster.nodes()
    pods = cluster.serving_pods("*" if all_namespaces else views.meta(rollouts[0]).get("namespace"))
    return [views.status_view(r, nodes, pods) for r in rollouts]


def render_views(args: argparse.Namespace, shown: Sequence[Mapping[str, Any]], now: float) -> str:
    if not shown:
        where = "any namespace" if args.all_namespaces else f"namespace {args.namespace or 'of the context'}"
        return f"no GluonRollout in {where}\n"
    wide = args.output == "wide"
    return "\n".join(views.render_status(v, now, wide=wide, width=terminal_width()) for v in shown)


def terminal_width() -> int:
    """A terminal's own width, else what normal output fits (views.TERMINAL_WIDTH)."""
    import shutil

    if sys.stdout.isatty():
        return shutil.get_terminal_size((views.TERMINAL_WIDTH, 24)).columns
    return views.TERMINAL_WIDTH


def cmd_status(args: argparse.Namespace, cluster: Cluster) -> int:
    if args.watch:
        return watch_status(args, cluster)
    if args.all_namespaces:
        shown = status_views(cluster, cluster.all_rollouts(), True)
        emit(args, shown, lambda data: render_views(args, data, time.time()))
        return 0
    shown = status_views(cluster, [cluster.rollout(args.rollout)], False)
    emit(args, shown[0], lambda data: render_views(args, [data], time.time()))
    return 0


CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen: a terminal's frame is redrawn in place
TICK = 1.0  # seconds between redraws without news, so time in state counts on


def watch_status(
    args: argparse.Namespace,
    cluster: Cluster,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.time,
    frames: int | None = None,
) -> int:
    """`status -w`: a watch on the GluonRollout(s); each event re-reads nodes and pods and redraws, and a
    terminal's frame is redrawn every second in between so time in state counts on. Ctrl-C ends it (0).
    Not a terminal (a pipe, -o json|yaml): one frame per change, nothing in between."""
    out = out or sys.stdout
    live = out.isatty() and args.output not in ("json", "yaml")
    events: queue.Queue[tuple[str, Any]] = queue.Queue()

    def pump() -> None:
        try:
            for event in cluster.watch_rollouts(args.rollout, args.all_namespaces):
                events.put(event)
        except PluginError as exc:
            events.put(("ERROR", exc))

    threading.Thread(target=pump, name="watch", daemon=True).start()
    rollouts: dict[tuple[str, str], dict[str, Any]] = {}
    shown: list[dict[str, Any]] = []
    drawn = 0
    try:
        while frames is None or drawn < frames:
            try:
                kind, obj = events.get(timeout=TICK)
            except queue.Empty:
                kind, obj = "TICK", None
            if kind == "ERROR":
                raise obj
            if kind == "LIST":
                rollouts = {key(r): r for r in obj.get("items") or []}
            elif kind == "DELETED":
                rollouts.pop(key(obj), None)
            elif kind != "TICK":
                rollouts[key(obj)] = obj
            if kind == "TICK" and not live:
                continue
            if kind != "TICK":
                if args.rollout and not rollouts and kind == "LIST":
                    raise PluginError(f"GluonRollout {args.rollout!r} in namespace {cluster.namespace!r} not found")
                shown = status_views(cluster, [rollouts[k] for k in sorted(rollouts)], args.all_namespaces)
            if live:
                out.write(CLEAR + render_views(args, shown, clock()))
            else:
                emit(
                    args,
                    shown if args.all_namespaces or not shown else shown[0],
                    lambda d: render_views(args, shown, clock()),
                    out,
                )
                out.write("\n" if args.output not in ("json", "yaml") else "")
            out.flush()
            drawn += 1
    except KeyboardInterrupt:
        out.write("\n")
    return 0


def key(rollout: Mapping[str, Any]) -> tuple[str, str]:
    return views.meta(rollout).get("namespace") or "", views.meta(rollout).get("name") or ""


def recorded_rollout(node: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the rollout the node's record names (contract.ANNOTATION_NODE_RECORD)."""
    record = views.raw_json(views.annotations(node).get(contract.ANNOTATION_NODE_RECORD))
    namespace, slash, name = str((record or {}).get("rollout") or "").partition("/")
    return (namespace, name) if slash and namespace and name else None


def cmd_explain(args: argparse.Namespace, cluster: Cluster) -> int:
    """The node first: its record names its rollout, wherever that is; else the namespace's only one."""
    node = cluster.node(args.node)
    named = recorded_rollout(node)
    if args.rollout or named is None:
        rollout = cluster.rollout(args.rollout)
    else:
        rollout = cluster.rollout(named[1], named[0])
    pods = cluster.serving_pods(views.meta(rollout).get("namespace"))
    record = views.explain(rollout, node, pods, cluster.agent_pods(args.agent_selector), time.time())
    emit(args, record, views.render_explain)
    return 0


def cmd_plan(args: argparse.Namespace, cluster: Cluster) -> int:
    rollout = cluster.rollout(args.rollout)
    pods = cluster.serving_pods() + cluster.agent_pods(args.agent_selector)
    emit(args, views.preview(rollout, cluster.nodes(), pods, time.time()), views.render_plan)
    return 0


def control(
    build: Callable[[argparse.Namespace, Mapping[str, Any]], Mapping[str, Any]], done: str
) -> Callable[..., int]:
    """A command that patches the rollout with what `build` makes of it, then says what it did."""

    def run(args: argparse.Namespace, cluster: Cluster) -> int:
        rollout = cluster.rollout(args.rollout)
        patched = cluster.patch_rollout(rollout, build(args, rollout))
        emit(args, patched, lambda _: f"{views.rollout_ref(rollout)} {done}\n")
        return 0

    return run


def cmd_retry(args: argparse.Namespace, cluster: Cluster) -> int:
    node = cluster.node(args.node)
    rollout = cluster.rollout(args.rollout) if args.rollout else None
    body = controls.retry(rollout, node)
    reason = controls.rollback_summary(node)
    patched = cluster.patch_node(args.node, body)
    emit(
        args,
        patched,
        lambda _: (
            f"node {args.node!r}: rollback record cleared (was: {reason}); "
            "the operator judges it again on its next reconcile\n"
        ),
    )
    return 0


COMMANDS: dict[str, tuple[str, Callable[..., int]]] = {
    "status": ("a table of the rollout's nodes: state, flag in use, effect and reason", cmd_status),
    "explain": ("the whole decision record of one node", cmd_explain),
    "plan": ("the next reconcile's plan, as a dry run: nothing is written", cmd_plan),
    "pause": ("stop enabling nodes (spec.paused=true)", control(lambda a, r: controls.pause(r), "paused")),
    "resume": ("resume (spec.paused=false) and lift an abort", control(lambda a, r: controls.resume(r), "resumed")),
    "promote": ("grant the approval gate the rollout waits at", control(lambda a, r: controls.promote(r), "promoted")),
    "abort": (
        "abort the rollout: flag-on nodes are disabled",
        control(lambda a, r: controls.abort(r, a.reason), "aborted"),
    ),
    "retry": ("clear a node's rollback record, so it is judged again", cmd_retry),
}


def common_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """kubectl's flags, accepted before and after the command. Only the top level sets defaults: a
    sub-parser's default would overwrite a flag given before the command."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--kubeconfig", default=default(None), help="path to the kubeconfig (default: KUBECONFIG, then ~/.kube/config)"
    )
    parser.add_argument(
        "--context", default=default(None), help="the kubeconfig context to use (default: the current one)"
    )
    parser.add_argument(
        "-n", "--namespace", default=default(None), help="the rollout's namespace (default: the context's)"
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default=default(None),
        help="wide: every column and the whole reason; json|yaml: everything, for scripts",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", default=argparse.SUPPRESS, help="-o json"
    )
    parser.add_argument(
        "--agent-selector", default=default(DEFAULT_AGENT_SELECTOR), help="label selector of the agent pods"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubectl gluon", description="Watch and steer GluonRollouts (gluon-rollout).")
    common_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    common_options(common, defaults=False)
    parser.add_argument("--version", action="version", version=f"kubectl-gluon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        if name in ("explain", "retry"):
            p.add_argument("node", metavar="NODE")
            p.add_argument("--rollout", "-r", help="the GluonRollout (default: the only one in the namespace)")
        else:
            p.add_argument("rollout", metavar="ROLLOUT", nargs="?", help="default: the only one in the namespace")
        if name == "abort":
            p.add_argument("--reason", help="why; recorded in the abort annotation, status and Events")
        if name == "status":
            p.add_argument(
                "-w", "--watch", action="store_true", help="watch the rollout: redraw on each change (Ctrl-C ends)"
            )
            p.add_argument("-A", "--all-namespaces", action="store_true", help="every GluonRollout, in all namespaces")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.watch = getattr(args, "watch", False)
    args.all_namespaces = getattr(args, "all_namespaces", False)
    if args.all_namespaces and args.rollout:
        parser.error("-A/--all-namespaces lists every rollout: name none")
    try:
        cluster = Cluster(args.kubeconfig, args.context, args.namespace)
        return COMMANDS[args.command][1](args, cluster)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
