"""The writes behind `kubectl gluon pause|resume|promote|abort|retry`: JSON merge patches built from the
objects as read, or a PluginError saying why there is nothing to do. Pure: no API calls."""

from __future__ import annotations

from typing import Any, Mapping

from gluon_common import contract

from .. import gating
from .views import PluginError, annotations, meta, node_records, rollout_ref

DEFAULT_ABORT_REASON = "aborted by a person with kubectl gluon abort"


def pause(rollout: Mapping[str, Any]) -> dict[str, Any]:
    return {"spec": {"paused": True}}


def resume(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """Unpause, and lift an abort: the operator resumes a rollout once its abort annotation is gone."""
    patch: dict[str, Any] = {"spec": {"paused": False}}
    if contract.ANNOTATION_ROLLOUT_ABORT in annotations(rollout):
        patch["metadata"] = {"annotations": {contract.ANNOTATION_ROLLOUT_ABORT: None}}
    return patch


def promote(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """Grant the gate the operator waits at, exactly as status.approval.waitingFor names it. The patch
    carries the resourceVersion read, so a gate that moved on meanwhile gives a conflict, not a wrong grant."""
    status = rollout.get("status") or {}
    gate = (status.get("approval") or {}).get("waitingFor")
    if not gate:
        raise PluginError(
            f"{rollout_ref(rollout)} is not waiting for approval (phase {status.get('phase') or 'unknown'}; "
            "status.approval.waitingFor is empty): nothing to promote"
        )
    return {
        "metadata": {
            "resourceVersion": meta(rollout).get("resourceVersion"),
            "annotations": {contract.ANNOTATION_ROLLOUT_APPROVE: str(gate)},
        }
    }


def abort(rollout: Mapping[str, Any], reason: str | None) -> dict[str, Any]:
    reason = (reason or "").strip() or DEFAULT_ABORT_REASON
    return {"metadata": {"annotations": {contract.ANNOTATION_ROLLOUT_ABORT: reason}}}


def retry(rollout: Mapping[str, Any] | None, node: Mapping[str, Any]) -> dict[str, Any]:
    """Clear the node's rollback record, so the operator judges it afresh on its next reconcile."""
    name = meta(node).get("name")
    if contract.ANNOTATION_ROLLBACK not in annotations(node):
        state = (node_records(rollout or {}, [node]).get(name) or {}).get("state")
        raise PluginError(
            f"node {name!r} has no rollback record ({contract.ANNOTATION_ROLLBACK})"
            + (f"; its state in {rollout_ref(rollout or {})} is {state}" if state else "")
            + ": nothing to retry"
        )
    return {"metadata": {"annotations": {contract.ANNOTATION_ROLLBACK: None}}}


def rollback_summary(node: Mapping[str, Any]) -> str:
    record, problem = gating.parse_rollback(annotations(node))
    return record.reason if record else problem or "no record"
