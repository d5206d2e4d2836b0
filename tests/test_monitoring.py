"""The harness's monitoring pieces that need no cluster: the config-reloader's rewrite of the Prometheus
Operator's generated config (monitoring.py), the pod network's relays (podnet.py), the loopback pod CIDRs
and the SGLang exporter's labels (the chart's relabelings supply node and flag)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from gluon_localcluster import fleet
from gluon_localcluster.fake_sglang import FakeSglang, NodeModel
from gluon_localcluster.monitoring import dashboard_queries, expand_env, localize, monitoring_values, prometheus_object
from gluon_localcluster.podnet import Forwarder, NetNamespace, running_ip
from tests.helpers import free_port

GENERATED = {
    "global": {"external_labels": {"prometheus": "monitoring/gluon", "prometheus_replica": "prometheus-gluon-0"}},
    "rule_files": ["/etc/prometheus/rules/prometheus-gluon-rulefiles-0/*.yaml"],
    "scrape_configs": [
        {
            "job_name": "podMonitor/gluon-system/gluon-rollout-agent/0",
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": ["gluon-system"]}}],
            "relabel_configs": [{"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}],
        }
    ],
}


def test_localize_points_service_discovery_at_the_kubeconfig_and_rules_at_their_folder(tmp_path):
    local = localize(GENERATED, tmp_path / "sa.kubeconfig", tmp_path / "rules")
    sd = local["scrape_configs"][0]["kubernetes_sd_configs"][0]
    assert sd == {
        "role": "pod",
        "namespaces": {"names": ["gluon-system"]},
        "kubeconfig_file": str(tmp_path / "sa.kubeconfig"),
    }
    assert local["rule_files"] == [str(tmp_path / "rules" / "prometheus-gluon-rulefiles-0" / "*.yaml")]
    assert local["scrape_configs"][0]["relabel_configs"] == GENERATED["scrape_configs"][0]["relabel_configs"]
    assert "kubeconfig_file" not in GENERATED["scrape_configs"][0]["kubernetes_sd_configs"][0]  # not mutated


def test_localize_refuses_another_in_pod_path_naming_where():
    config = {"scrape_configs": [{"job_name": "x", "authorization": {"credentials_file": "/etc/prometheus/secrets/t"}}]}
    with pytest.raises(ValueError, match=r"scrape_configs\[0\]\.authorization\.credentials_file .*/etc/prometheus/"):
        localize(config, Path("/k"), Path("/r"))


def test_expand_env_as_the_config_reloader_does():
    assert expand_env("replica: $(POD_NAME)", {"POD_NAME": "prometheus-gluon-0"}) == "replica: prometheus-gluon-0"
    with pytest.raises(ValueError, match=r"\$\(NODE_NAME\)"):
        expand_env("x: $(NODE_NAME)", {"POD_NAME": "p"})


def test_the_prometheus_object_selects_the_chart_release_label():
    spec = prometheus_object("kube-prometheus-stack", "v2.42.0")["spec"]
    for kind in ("serviceMonitor", "podMonitor", "rule"):
        assert spec[f"{kind}Selector"] == {"matchLabels": {"release": "kube-prometheus-stack"}}
        assert spec[f"{kind}NamespaceSelector"] == {}
    values = monitoring_values("kube-prometheus-stack", serving_labels={"app": "sglang"})["monitoring"]
    assert values["release"] == "kube-prometheus-stack" and values["servingPodMonitor"]["selector"] == {
        "matchLabels": {"app": "sglang"}
    }


def test_pod_cidrs_are_distinct_in_the_pod_network():
    cidrs = [fleet.pod_cidr(i) for i in range(256)]
    assert len(set(cidrs)) == 256 and all(c.startswith("10.244.") and c.endswith(".0/24") for c in cidrs)
    assert fleet.kwok_node("n", 440, pod_index=3)["spec"] == {"podCIDR": "10.244.3.0/24"}
    assert fleet.kwok_node("n", 3)["spec"] == {}
    with pytest.raises(ValueError, match="0..255"):
        fleet.pod_cidr(256)


def test_running_ip_only_while_the_pod_runs():
    pod = {"metadata": {}, "status": {"phase": "Running", "podIP": "127.20.1.2"}}
    assert running_ip(pod) == "127.20.1.2"
    assert running_ip({"metadata": {}, "status": {"phase": "Pending", "podIP": "127.20.1.2"}}) is None
    assert running_ip({"metadata": {"deletionTimestamp": "x"}, "status": pod["status"]}) is None


def test_a_forwarder_relays_from_the_pod_network_namespace():
    """The namespace's 10.244.0.0/16 is local inside it only; a relay listening there reaches the host."""
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen()
    threading.Thread(target=lambda: backend.accept()[0].sendall(b"hello"), daemon=True).start()
    netns = NetNamespace()
    port = free_port()
    relay = Forwarder(("10.244.7.9", port), backend.getsockname(), listen_ns=netns)
    try:
        with pytest.raises(OSError):
            socket.create_connection(("10.244.7.9", port), timeout=1)  # not on the host
        with netns.entered(), socket.create_connection(("10.244.7.9", port), timeout=5) as c:
            assert c.recv(10) == b"hello"
    finally:
        relay.stop()
        netns.stop()
        backend.close()


def test_a_forwarder_relays_both_ways_and_refuses_when_the_backend_is_gone():
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen()

    def echo() -> None:
        conn, _ = backend.accept()
        with conn:
            conn.sendall(conn.recv(100).upper())

    threading.Thread(target=echo, daemon=True).start()
    port = free_port()
    relay = Forwarder(("127.20.9.9", port), backend.getsockname())
    try:
        with socket.create_connection(("127.20.9.9", port), timeout=5) as c:
            c.sendall(b"scrape")
            assert c.recv(100) == b"SCRAPE"
        backend.close()
        with socket.create_connection(("127.20.9.9", port), timeout=5) as c:
            assert c.recv(100) == b""  # closed at once: the scrape fails, the target is down
    finally:
        relay.stop()


def test_the_exporter_leaves_node_and_flag_to_the_scrape():
    """SGLang's own labels only: node, flag, namespace and app come from the serving PodMonitor's relabelings
    (tests/test_cluster_monitoring.py checks them on the scraped series)."""
    flag = {"value": "0"}
    exporter = FakeSglang(NodeModel("gpu-01", noise=0.0), lambda: flag["value"])
    exporter.count, exporter.seconds, exporter.flag = 15.0, 1.25, "1"
    families = list(exporter.collect())
    assert {f.name for f in families} == {
        "sglang:inter_token_latency_seconds",
        "sglang:generation_tokens",
        "sglang:gen_throughput",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
    }
    samples = [s for f in families for s in f.samples]
    assert all(set(s.labels) <= {"model_name", "engine_type", "tp_rank", "le"} for s in samples)
    count = [s for s in samples if s.name == "sglang:inter_token_latency_seconds_count"]
    assert len(count) == 1 and count[0].value == 15.0  # one counter across the node's pods, whatever their flag


def test_dashboard_queries_replace_the_variables_of_every_panel():
    dashboard = json.loads(
        (Path(__file__).resolve().parents[1] / "charts/gluon-rollout/files/dashboard.json").read_text()
    )
    queries = dashboard_queries(dashboard, {"namespace": "serving"})
    assert len(queries) == sum(len(p.get("targets") or []) for p in dashboard["panels"]) > 5
    assert all("$" not in q for _, q in queries) and any('namespace=~"serving"' in q for _, q in queries)
    with pytest.raises(ValueError, match=r"panel 'p': a variable is not replaced"):
        dashboard_queries({"panels": [{"title": "p", "targets": [{"expr": 'up{x=~"$other"}'}]}]}, {"namespace": "s"})


def test_a_route_into_a_real_nodes_namespace_is_the_same_route_when_named_again():
    """The pod network compares each sync's routes with its forwarders' (podnet.PodNetwork.sync): a real node's
    pod is routed through NetNamespace.at(its path) anew every sync, and must not be torn down and rebuilt."""
    first = ("10.244.1.5", 30000, NetNamespace.at("/run/netns/gluon-1-42"))
    again = ("10.244.1.5", 30000, NetNamespace.at("/run/netns/gluon-1-42"))
    assert first == again and hash(first) == hash(again)
    assert first != ("10.244.1.5", 30000, NetNamespace.at("/run/netns/gluon-2-42"))
