"""The chart's two operator replicas (kopf peering) on the real control plane, as local processes with the
operator ServiceAccount's token: one serves, the other waits, and takes over when the first leaves. Before
start-time priorities, both ran at kopf's default priority 0, and kopf pauses every operator of equal
priority: two replicas served nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kubernetes import client

from gluon_localcluster import fleet
from gluon_localcluster.controlplane import free_port
from gluon_localcluster.processes import operator as start_operator
from gluon_operator.cli import start_priority
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.helpers import wait_for

NAMESPACE = "peering"
RECONCILED = "Timer 'reconcile' succeeded"  # kopf's line for each reconcile of a rollout


def test_an_earlier_start_ranks_higher():
    assert start_priority(1_800_000_000.0) > start_priority(1_800_000_000.001) > 0


def observed(custom, name: str) -> int:
    body = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    return int((body.get("status") or {}).get("observedGeneration") or 0)


@pytest.fixture
def replicas(installed):
    """Start two replicas of the chart's peering, the second a moment after the first."""
    here = Path(__file__).resolve().parent.parent
    checkout = os.pathsep.join(str(here / d) for d in ("common", "agent", "operator", ""))
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    peerings = custom.list_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings")["items"]
    assert [p["metadata"]["name"] for p in peerings], "the chart creates its ClusterKopfPeering"
    peering = peerings[0]["metadata"]["name"]
    started = []
    for _ in range(2):
        started.append(
            start_operator(
                installed,
                reconcile_seconds=0.5,
                peering=peering,
                PYTHONPATH=checkout,
                GLUON_WEBHOOK_PORT=str(free_port()),
            )
        )
        time.sleep(1.0)
    yield started
    for process in started:
        process.stop()


def test_one_replica_serves_and_the_other_takes_over_when_it_leaves(installed, replicas):
    first, second = replicas
    core = client.CoreV1Api(installed.cp.admin_client())
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, fleet.rollout("ha", NAMESPACE))
    wait_for(lambda: observed(custom, "ha") == 1, timeout=60, interval=0.5, what=f"a replica serving:\n{first.tail()}")
    time.sleep(3)  # the later replica has seen the peering by now: it starts paused and stays so
    assert RECONCILED in first.tail(400) and RECONCILED not in second.tail(400), second.tail()
    assert "Possibly conflicting operators" not in first.tail(400) + second.tail(400)

    first.stop()  # a clean exit leaves the peering at once (kopf touches it with lifetime 0)
    custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "ha", {"spec": {"paused": True}})
    wait_for(
        lambda: observed(custom, "ha") == 2,
        timeout=60,
        interval=0.5,
        what=f"the second replica taking over:\n{second.tail()}",
    )
    assert "Resuming operations" in second.tail(400) and RECONCILED in second.tail(400)
