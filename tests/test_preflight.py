"""The preflight as it runs in a serving pod: installed by the agent image into a shared folder, then
run by a *foreign* interpreter (a bare venv: stdlib only) against a live agent, a dead agent, and image
stacks that are and are not capable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

import pytest
from kubernetes import client

from gluon_agent import contract
from gluon_agent.preflight import FLAG_FILE_NAME, flag_line, install
from tests.clusterkit import MERGE, Nodes, api_for
from tests.fakes.stacks import AITER_STACK, TORCH_GFX950, write_tree
from tests.helpers import free_port, http_json, running_agent, wait_for


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A serving image's python3 as far as we know it: nothing of ours installed."""
    folder = tmp_path_factory.mktemp("image")
    venv.create(folder / "venv", with_pip=False)
    return str(folder / "venv" / "bin" / "python")


@pytest.fixture
def shared(tmp_path):
    """The pod's emptyDir after the install init container ran."""
    install(tmp_path / "gluon")
    return tmp_path / "gluon"


def run_preflight(python, shared, agent_url, stack_paths=(), extra_env=None):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join([str(shared / "lib"), *map(str, stack_paths)])}
    env.update(extra_env or {})
    termination = shared / "termination-log"
    argv = [python, "-m", "gluon_agent.preflight", "--flag-dir", str(shared), "--termination-log", str(termination),
            "--agent-timeout", "2", "--probe-timeout", "20"]
    if agent_url:
        argv += ["--agent-url", agent_url]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # never fails the pod
    return (shared / FLAG_FILE_NAME).read_text(), json.loads(termination.read_text())


def test_install_through_the_console_command(tmp_path):
    """Exactly the install init container's command line (webhook.INSTALL_CONTAINER)."""
    done = subprocess.run([sys.executable, "-m", "gluon_agent", "preflight", "--install", str(tmp_path / "g")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "g" / FLAG_FILE_NAME).read_text() == flag_line("0")


def test_install_writes_the_safe_default(shared):
    assert (shared / FLAG_FILE_NAME).read_text() == flag_line("0") == f"{contract.FLAG_ENV}='0'\n"
    assert (shared / "lib" / "gluon_agent" / "preflight.py").exists()


@pytest.fixture(scope="module")
def node(installed):
    made = Nodes(installed, "pre")
    try:
        made.create("n1", 360)
        made.wait_for_agents()
        yield made
    finally:
        made.delete()


@pytest.fixture
def enabled_agent(node, installed, tmp_path):
    """A live agent (its token bound to its DaemonSet pod) whose node the operator enabled."""
    from gluon_agent.sources import simulated_node

    name = node.name("n1")
    node.reset()
    client.CoreV1Api(api_for(installed.operator_kubeconfig())).patch_node(
        name, {"metadata": {"labels": {contract.LABEL_ENABLED: "true", contract.LABEL_STATE: "Enabling"}}}, _content_type=MERGE)
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(simulated_node()))
    with running_agent(installed.agent_kubeconfig(name), name, sim) as agent:
        url = agent.url + contract.DECISION_PATH
        wait_for(lambda: http_json(url)[1].get("flag") == "1", what="agent decision 1")
        yield url


def test_live_agent_and_capable_image_gives_1(bare_python, shared, enabled_agent, tmp_path):
    torch = write_tree(tmp_path / "torch", TORCH_GFX950)
    flag, verdict = run_preflight(bare_python, shared, enabled_agent, stack_paths=(AITER_STACK, torch, triton_site()))
    assert flag == f"{contract.FLAG_ENV}='1'\n"
    assert verdict["flag"] == "1" and verdict["agent"]["flag"] == "1" and verdict["probe"]["capable"] is True
    assert "this image is capable" in verdict["reason"]


def test_live_agent_but_image_not_capable_gives_0(bare_python, shared, enabled_agent):
    flag, verdict = run_preflight(bare_python, shared, enabled_agent)  # the bare image: no aiter, no torch
    assert flag == f"{contract.FLAG_ENV}='0'\n"
    assert verdict["agent"]["flag"] == "1" and verdict["probe"]["capable"] is False
    assert verdict["reason"].startswith("this image's stack is not capable: aiter.ops.triton.gluon.mla_gluon import")


def test_dead_agent_gives_0(bare_python, shared):
    dead = f"http://127.0.0.1:{free_port()}{contract.DECISION_PATH}"
    flag, verdict = run_preflight(bare_python, shared, dead)
    assert flag == f"{contract.FLAG_ENV}='0'\n" and verdict["flag"] == "0"
    assert verdict["reason"].startswith(f"agent at {dead} did not answer: URLError")


def test_no_host_ip_gives_0(bare_python, shared):
    flag, verdict = run_preflight(bare_python, shared, None)
    assert flag.endswith("'0'\n") and verdict["reason"] == "no agent address (HOST_IP unset)"


def triton_site() -> str:
    """The real PyPI Triton for the capable-image case (cga_layout present), from our venv."""
    import triton

    return os.path.dirname(os.path.dirname(triton.__file__))
