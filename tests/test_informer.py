"""The node and pod caches (operator/gluon_operator/informer.py): the pure cache, and list-then-watch
against the API emulator with dropped watches and injected 500s."""

from __future__ import annotations

from kubernetes import client

from gluon_agent.kube import make_api_client
from gluon_operator.informer import Informer
from tests.apiserver import ApiServerThread
from tests.cluster import NODES, gpu_node
from tests.helpers import wait_for


def pod(uid: str, node: str | None, namespace: str = "a") -> dict:
    return {"metadata": {"uid": uid, "name": f"p-{uid}", "namespace": namespace}, "spec": {"nodeName": node}}


def by_node(obj):
    node = obj["spec"].get("nodeName")
    return {node: obj["metadata"]["name"]} if node else None


def test_cache_adds_moves_deletes_and_replaces():
    informer = Informer("pods", lambda **_: None, {"by_node": by_node})
    informer.apply("ADDED", pod("1", "n1"))
    informer.apply("ADDED", pod("2", "n1"))
    informer.apply("ADDED", pod("3", None))  # unscheduled: in no index
    index = informer.snapshot("by_node")
    assert sorted(index.get("n1")) == ["p-1", "p-2"] and list(index) == ["n1"]
    informer.apply("MODIFIED", pod("2", "n2"))  # moved: gone from its old key
    informer.apply("DELETED", pod("1", "n1"))
    index = informer.snapshot("by_node")
    assert index.get("n1") is None and index.get("n2") == ["p-2"] and len(index) == 1
    informer.replace([pod("9", "n9")])  # a relist: what is not listed is gone
    assert list(informer.snapshot("by_node")) == ["n9"]
    assert index.get("n2") == ["p-2"]  # an earlier snapshot does not change under the reader


def test_list_then_watch_survives_dropped_watches_and_errors():
    with ApiServerThread() as api:
        api.call(lambda: api.server.put_object(NODES, gpu_node("n1")))
        api.server.watch_drop_seconds = 0.5
        errors = []
        core = client.CoreV1Api(make_api_client(api.url))
        informer = Informer("nodes", core.list_node, {"names": lambda o: {o["metadata"]["name"]: o["metadata"].get("labels", {})}},
                            watch_timeout=5, on_error=errors.append).start()
        try:
            wait_for(informer.synced.is_set, timeout=10, what="first list")
            assert informer.snapshot("names").get("n1")
            api.call(lambda: api.server.put_object(NODES, gpu_node("n2")))
            wait_for(lambda: informer.snapshot("names").get("n2") is not None, timeout=10, what="n2 through the watch")
            calls = {"n": 0}

            def flaky(request):  # every other request fails: watches end every 0.5 s, so reconnects hit it
                calls["n"] += 1
                return 500 if calls["n"] % 2 else None
            api.server.faults.append(flaky)
            wait_for(lambda: errors, timeout=10, what="a failed reconnect")
            api.call(lambda: api.server.put_object(NODES, gpu_node("n3")))
            api.call(lambda: api.server._delete(NODES, (NODES, None, "n1")))
            wait_for(lambda: informer.snapshot("names").get("n3") is not None and informer.snapshot("names").get("n1") is None,
                     timeout=20, what="n3 in, n1 out, despite errors")
            assert errors[0].status == 500
        finally:
            informer.close()


def test_an_object_an_indexer_cannot_read_is_left_out_not_fatal():
    def strict(obj):
        return {obj["spec"]["nodeName"].upper(): obj["metadata"]["name"]}  # fails on a pod without a node
    informer = Informer("pods", lambda **_: None, {"strict": strict})
    informer.replace([pod("1", "n1"), pod("2", None), pod("3", "n3")])
    informer.apply("ADDED", pod("4", None))
    index = informer.snapshot("strict")
    assert sorted(index) == ["N1", "N3"] and informer.unreadable == 2


def test_pod_cache_readings_survive_hostile_pods():
    """issue 21: any pod anywhere could carry a preflight container with a message of the wrong shape."""
    from gluon_operator import world

    hostile = {"metadata": {"name": "x", "namespace": "tenant", "creationTimestamp": "2026-12-01T00:00:00Z"}, "spec": {"nodeName": "n1"},
               "status": {"initContainerStatuses": [{"name": "gluon-preflight", "state": {"terminated": {"message": '{"agent": "x", "flag": 3}'}}},
                                                    "junk"]}}
    view = world.pod_view(hostile)
    assert view is not None and view.flag is None and "the preflight message field" in view.preflight_reason
    assert world.agent_entry(hostile) is None


def test_label_selectors_for_the_api_server():
    from gluon_operator.world import label_selector

    assert label_selector({"matchLabels": {"b": "2", "a": "1"}}) == "a=1,b=2"
    assert label_selector({"matchExpressions": [{"key": "k", "operator": "In", "values": ["y", "x"]}, {"key": "j", "operator": "Exists"},
                                                {"key": "m", "operator": "NotIn", "values": ["z"]}, {"key": "d", "operator": "DoesNotExist"}]}) \
        == "k in (x,y),j,m notin (z),!d"
    assert label_selector({"matchExpressions": [{"key": "k", "operator": "Near"}]}) == ""  # not a selector: its rollout is Invalid
    assert label_selector("nonsense") == ""  # type: ignore[arg-type]
