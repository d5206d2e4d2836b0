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


def cmd_run(args: argparse.Namespace) -> int:
    import logging

    import kopf

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from . import handlers  # noqa: F401 - registers the handlers

    kopf.run(
        clusterwide=True,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority,
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


def cmd_prune_nodes(args: argparse.Namespace) -> int:
    """The chart's post-delete hook: nothing keeps our keys true once agents and operator are gone."""
    from kubernetes import client

    from gluon_common.kube import MERGE_PATCH, make_api_client

    from . import records

    core = client.CoreV1Api(make_api_client(args.api_url))
    nodes = records.loads(core.list_node(_preload_content=False).data, max_bytes=records.PAGE_BYTES_LIMIT)["items"]
    pruned = 0
    for node in nodes:
        patch = prune_patch(node)
        if patch:
            core.patch_node(node["metadata"]["name"], patch, _content_type=MERGE_PATCH, _preload_content=False)
            pruned += 1
    print(json.dumps({"nodes": len(nodes), "pruned": pruned}))
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
    r.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    r.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint")
    r.add_argument("--log-level", default="INFO")
    r.set_defaults(func=cmd_run)
    n = sub.add_parser(
        "prune-nodes", help="remove every label and annotation under our prefix from all nodes (post-delete hook)"
    )
    n.add_argument("--api-url", help="Kubernetes API URL without auth (tests); default in-cluster or kubeconfig")
    n.set_defaults(func=cmd_prune_nodes)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
