"""`gluon-operator`: the operator's command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from gluon_common import contract

from . import __version__


def cmd_contract(args: argparse.Namespace) -> int:
    print(json.dumps(contract.as_dict(), indent=2, sort_keys=True))
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from .crd import crd_yaml

    print(crd_yaml(), end="")
    return 0


# kopf's peering is not a leader election: replicas of equal priority all pause ("Possibly conflicting
# operators with the same priority", kopf/_core/engines/peering.py), so two replicas at the default 0 would
# leave every rollout unserved. Each replica takes a priority from its start time instead, the earliest
# highest: the running one keeps working, a newcomer (a restart, a rolling update's new pod) waits, and takes
# over when the active one leaves the peering (at once on a clean exit, after kopf's peering lifetime, 60 s,
# when it is killed).
PRIORITY_EPOCH_MS = 10**13  # about the year 2286: start-time priorities stay positive until then


def start_priority(now: float) -> int:
    """The peering priority of a replica started at unix time `now`: earlier starts rank higher."""
    return PRIORITY_EPOCH_MS - int(now * 1000)


def cmd_run(args: argparse.Namespace) -> int:
    import logging
    import time

    import kopf

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from . import handlers  # noqa: F401 - registers the handlers

    kopf.run(
        clusterwide=True,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=start_priority(time.time()) if args.priority is None else args.priority,
        liveness_endpoint=args.liveness,
    )
    return 0


def prune_patch(node: dict) -> dict | None:
    """A merge patch removing every label and annotation under the contract prefix (None: nothing to do)."""
    meta = node.get("metadata", {})
    labels = {k: None for k in (meta.get("labels") or {}) if contract.is_ours(k)}
    annotations = {k: None for k in (meta.get("annotations") or {}) if contract.is_ours(k)}
    if not labels and not annotations:
        return None
    return {"metadata": {"labels": labels, "annotations": annotations}}


def finalizer_patch(rollout: dict) -> dict | None:
    """A merge patch taking the operator's finalizer off a GluonRollout, guarded by its resourceVersion
    (a finalizer someone else adds meanwhile is not lost: the patch fails and the next pass retries)."""
    from .spec import ROLLOUT_FINALIZER

    meta = rollout.get("metadata", {})
    finalizers = list(meta.get("finalizers") or [])
    if ROLLOUT_FINALIZER not in finalizers:
        return None
    kept = [f for f in finalizers if f != ROLLOUT_FINALIZER]
    return {"metadata": {"finalizers": kept or None, "resourceVersion": meta.get("resourceVersion")}}


def release_rollouts(api: object, settle: float, deadline: float) -> int:
    """Take the operator's finalizer off every GluonRollout, pass after pass `settle` seconds apart, until a
    pass finds none (an operator replica still terminating could add it again) or `deadline` passes.
    Returns how many finalizers were removed."""
    import time

    from kubernetes import client

    from gluon_common.kube import MERGE_PATCH

    from . import records
    from .spec import GROUP, PLURAL, VERSION

    custom = client.CustomObjectsApi(api)
    removed, stop = 0, time.monotonic() + deadline
    while True:
        listed = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False)
        patches = [
            (r, finalizer_patch(r)) for r in records.loads(listed.data, max_bytes=records.PAGE_BYTES_LIMIT)["items"]
        ]
        patches = [(r, p) for r, p in patches if p is not None]
        if not patches or time.monotonic() > stop:
            return removed
        for rollout, patch in patches:
            meta = rollout["metadata"]
            try:
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], patch, _content_type=MERGE_PATCH
                )
                removed += 1
            except client.ApiException as failure:
                if failure.status not in (404, 409):  # gone, or changed meanwhile: the next pass sees it
                    raise
        time.sleep(settle)


def cmd_prune_nodes(args: argparse.Namespace) -> int:
    """The chart's post-delete hook: nothing keeps our keys true once agents and operator are gone, and
    nothing would remove the operator's finalizer from the GluonRollouts Helm leaves."""
    from kubernetes import client

    from gluon_common.kube import MERGE_PATCH, make_api_client

    from . import records

    api = make_api_client(args.api_url)
    core = client.CoreV1Api(api)
    nodes = records.loads(core.list_node(_preload_content=False).data, max_bytes=records.PAGE_BYTES_LIMIT)["items"]
    pruned = 0
    for node in nodes:
        patch = prune_patch(node)
        if patch:
            core.patch_node(node["metadata"]["name"], patch, _content_type=MERGE_PATCH, _preload_content=False)
            pruned += 1
    released = release_rollouts(api, args.settle_seconds, args.deadline_seconds)
    print(json.dumps({"nodes": len(nodes), "pruned": pruned, "rolloutFinalizersRemoved": released}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluon-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gluon-operator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("contract", help="print every label, annotation and metric name as JSON")
    p.set_defaults(func=cmd_contract)
    c = sub.add_parser("crd", help="print the GluonRollout CustomResourceDefinition (YAML)")
    c.set_defaults(func=cmd_crd)
    r = sub.add_parser("run", help="run the operator (kopf), cluster-wide")
    r.add_argument("--standalone", action="store_true", help="no peering (one replica, tests)")
    r.add_argument("--peering", default="gluon-rollout", help="kopf peering name shared by the replicas")
    r.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority of this replica (default: from its start time, the earliest replica active)",
    )
    r.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint")
    r.add_argument("--log-level", default="INFO")
    r.set_defaults(func=cmd_run)
    n = sub.add_parser(
        "prune-nodes", help="remove every label and annotation under our prefix from all nodes (post-delete hook)"
    )
    n.add_argument("--api-url", help="Kubernetes API URL without auth (tests); default in-cluster or kubeconfig")
    n.add_argument("--settle-seconds", type=float, default=5.0, help="between passes over the GluonRollouts")
    n.add_argument("--deadline-seconds", type=float, default=120.0, help="stop the passes after this long")
    n.set_defaults(func=cmd_prune_nodes)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
