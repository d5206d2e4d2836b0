"""`helm upgrade` on a real control plane of its own, by the procedure docs/operating/upgrades.md gives:
the CRDs applied first (`kubectl apply --server-side -f charts/gluon-rollout/crds/`: Helm never upgrades
crds/), then `helm upgrade`. The release before is this chart with a CRD that lacks `spec.dryRun` (a field
a later release added): an existing GluonRollout survives, and the new field is served afterwards. The
webhook's self-made certificate is kept across upgrades (lookup) and renewed by the first upgrade within
webhook.certificate.renewBeforeDays of its end, a Secret of the older chart (only `cert-created`) included."""

from __future__ import annotations

import base64
import datetime
import shutil

import pytest
import yaml
from kubernetes import client

from gluon_localcluster import ControlPlane
from gluon_localcluster.install import CHART, install
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.clusterkit import create_when_served
from tests.helpers import wait_for

CRD_FILE = "crds/gluonrollouts.gluonrollout.io.yaml"
SECRET = "gluon-rollout-webhook-tls"
NOT_AFTER = "gluon-rollout/cert-not-after"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ControlPlane(tmp_path_factory.mktemp("upgrade-cp")) as cp:
        yield cp


def chart_without_dry_run(where):
    """This chart as a release before `spec.dryRun` existed."""
    old = where / "gluon-rollout"
    shutil.copytree(CHART, old)
    crd = yaml.safe_load((old / CRD_FILE).read_text())
    for version in crd["spec"]["versions"]:
        del version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["dryRun"]
    (old / CRD_FILE).write_text(yaml.safe_dump(crd))
    return old


def secret(core: client.CoreV1Api, namespace: str) -> client.V1Secret:
    return core.read_namespaced_secret(SECRET, namespace)


def days_from_today(days: int) -> str:
    return (datetime.datetime.now(datetime.UTC).date() + datetime.timedelta(days=days)).isoformat()


def test_an_existing_rollout_survives_an_upgrade_with_a_changed_crd_and_the_certificate_is_kept(cluster, tmp_path):
    from gluon_localcluster import fleet

    admin = cluster.admin_client()
    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    installed = install(cluster, chart=chart_without_dry_run(tmp_path))
    core.create_namespace({"metadata": {"name": "apps"}})
    body = fleet.rollout("kimi", "apps", dryRun=True)
    wait_for(lambda: create_when_served(custom, body), timeout=30, what="the GluonRollout CRD established")
    before = custom.get_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "kimi")
    assert "dryRun" not in before["spec"]  # the old CRD does not know it: the API server prunes it
    cert = secret(core, installed.namespace)
    assert cert.metadata.annotations[NOT_AFTER] == days_from_today(365)

    installed.upgrade()  # without the CRDs first: Helm leaves crds/ as they are
    custom.patch_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "kimi", {"spec": {"dryRun": True}})
    assert "dryRun" not in custom.get_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "kimi")["spec"]

    installed.apply_crds()  # the documented procedure: the CRDs, then helm upgrade
    installed.upgrade()
    after = custom.get_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "kimi")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["podSelector"] == before["spec"]["podSelector"]
    custom.patch_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "kimi", {"spec": {"dryRun": True}})
    assert custom.get_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "kimi")["spec"]["dryRun"] is True
    assert secret(core, installed.namespace).data == cert.data  # the certificate is kept (lookup)

    # A Secret of the older chart (only cert-created, 10 days old): kept, its end recorded.
    core.patch_namespaced_secret(
        SECRET,
        installed.namespace,
        {"metadata": {"annotations": {NOT_AFTER: None, "gluon-rollout/cert-created": days_from_today(-10)}}},
    )
    installed.upgrade()
    kept = secret(core, installed.namespace)
    assert kept.data == cert.data and kept.metadata.annotations[NOT_AFTER] == days_from_today(355)

    # Within renewBeforeDays (90) of its end: the next upgrade makes a new certificate, valid 365 days.
    core.patch_namespaced_secret(
        SECRET, installed.namespace, {"metadata": {"annotations": {NOT_AFTER: days_from_today(30)}}}
    )
    installed.upgrade()
    renewed = secret(core, installed.namespace)
    assert renewed.data["tls.crt"] != cert.data["tls.crt"] and renewed.data["ca.crt"] != cert.data["ca.crt"]
    assert renewed.metadata.annotations[NOT_AFTER] == days_from_today(365)
    assert b"BEGIN CERTIFICATE" in base64.b64decode(renewed.data["tls.crt"])
    installed.upgrade()
    assert secret(core, installed.namespace).data == renewed.data
