"""The preflight as it runs in a serving pod: installed by the agent image into a shared folder, then
run by a *foreign* interpreter (a bare venv: stdlib only) against a live agent, a dead agent, and image
stacks that are and are not capable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv

import pytest
from kubernetes import client

from gluon_agent import preflight
from gluon_agent.preflight import FLAG_FILE_NAME, flag_line, install
from gluon_common import contract
from gluon_localcluster.fakes.stacks import AITER_STACK, TORCH_GFX950, TRITON_36, write_tree
from tests.clusterkit import MERGE, Nodes, api_for
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
    argv = [
        python,
        "-m",
        "gluon_agent.preflight",
        "--flag-dir",
        str(shared),
        "--termination-log",
        str(termination),
        "--agent-timeout",
        "2",
        "--probe-timeout",
        "20",
    ]
    if agent_url:
        argv += ["--agent-url", agent_url]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # never fails the pod
    return (shared / FLAG_FILE_NAME).read_text(), json.loads(termination.read_text())


def test_install_through_the_console_command(tmp_path):
    """Exactly the install init container's command line (webhook.INSTALL_CONTAINER)."""
    done = subprocess.run(
        [sys.executable, "-m", "gluon_agent", "preflight", "--install", str(tmp_path / "g")],
        capture_output=True,
        text=True,
        timeout=60,
    )
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
    from gluon_localcluster.fakes.simulated import simulated_node

    name = node.name("n1")
    node.reset()
    client.CoreV1Api(api_for(installed.operator_kubeconfig())).patch_node(
        name,
        {"metadata": {"labels": {contract.LABEL_ENABLED: "true", contract.LABEL_STATE: "Enabling"}}},
        _content_type=MERGE,
    )
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


# ---------------------------------------------------------------- hardening: environment, deadline, old interpreters

PYTHON38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"  # the machine's pyenv interpreters (machines/polyglot)
PYTHON37 = "/root/.pyenv/versions/3.7.16/bin/python3.7"

# Triton 3.7's Gluon API as far as the probe looks (cga_layout on PaddedSharedLayout), in plain Python so
# any interpreter imports it (the venv's real Triton is built for this venv's Python only).
TRITON_37 = {
    **TRITON_36,
    "triton/__init__.py": "__version__ = '3.7.0'\n",
    "triton/experimental/gluon/language/__init__.py": (
        "class PaddedSharedLayout:\n"
        "    def __init__(self, interval_padding_pairs, order, shape, cga_layout=None):\n        pass\n"
    ),
}
# The same ROCm torch as seen from an init container: the device plugin gives it no GPU.
TORCH_NO_GPU = {"torch/__init__.py": TORCH_GFX950["torch/__init__.py"].replace("return True", "return False")}
assert TORCH_NO_GPU["torch/__init__.py"].count("return False") == 1  # is_available(), nothing else


def interpreter(path: str) -> str:
    """An interpreter this test needs; the machine kind ships it (pyenv), so its absence is a failure."""
    assert os.access(path, os.X_OK), f"{path} is missing: these tests run the preflight under it"
    return path


def capable_stack(tmp_path) -> list[str]:
    return [
        str(AITER_STACK),
        str(write_tree(tmp_path / "torch", TORCH_NO_GPU)),
        str(write_tree(tmp_path / "triton", TRITON_37)),
    ]


def test_portable_modules_parse_as_python_3_8():
    """Every module the preflight copies into a serving image parses with Python 3.8's grammar."""
    import ast

    for source, relative in preflight.portable_sources():
        ast.parse(source.read_text(), filename=relative, feature_version=(3, 8))


def test_the_install_copies_every_portable_module_and_nothing_else(shared):
    """Both packages the preflight imports land under lib/: the agent's part and the shared contract."""
    copied = sorted(str(p.relative_to(shared / "lib")) for p in (shared / "lib").rglob("*.py"))
    assert copied == sorted(relative for _, relative in preflight.portable_sources())
    assert {"gluon_agent/preflight.py", "gluon_common/contract.py", "gluon_common/sglang_routes.py"} <= set(copied)


def run_script(shared, env, shell="sh", deadline_s=60, timeout=90):
    """The preflight container's command (webhook.preflight_script) on our emptyDir, as a serving image's
    shell runs it: `env` stands for the image's ENV (its PATH, its PYTHONPATH)."""
    started = time.monotonic()
    done = subprocess.run(
        [shell, "-c", webhook_script(shared, deadline_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=shared,
    )
    assert done.returncode == 0, done.stderr
    verdict = json.loads((shared / "termination-log").read_text())
    return (shared / FLAG_FILE_NAME).read_text(), verdict, time.monotonic() - started


def image_env(tmp_path, python: str, agent_url: str, stack=()) -> dict[str, str]:
    """A serving image's ENV: its PATH (whose python3 is `python`), its PYTHONPATH, and the agent's address."""
    folder = tmp_path / "image-bin"
    folder.mkdir(exist_ok=True)
    if not (folder / "python3").exists():
        (folder / "python3").symlink_to(python)
    env = {"PATH": f"{folder}:/usr/bin:/bin", contract.ENV_PREFLIGHT_AGENT_URL: agent_url}
    if stack:
        env["PYTHONPATH"] = os.pathsep.join(stack)
    return env


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_the_image_pythonpath_is_kept_and_python_3_8_serves(shell, shared, enabled_agent, tmp_path):
    """A Python 3.8 image whose stack sits on its own PYTHONPATH, with no GPU in the init container, is
    capable: our path is added in front of the image's, not put in its place."""
    env = image_env(tmp_path, interpreter(PYTHON38), enabled_agent, capable_stack(tmp_path))
    flag, verdict, _ = run_script(shared, env, shell=shell)
    assert flag == f"{contract.FLAG_ENV}='1'\n", verdict
    assert verdict["flag"] == "1" and "this image is capable" in verdict["reason"]
    assert verdict["probe"]["capable"] is False  # the probe itself says no GPU: that is the agent's part


def test_python_below_the_floor_is_refused_finally(shared, tmp_path):
    """A python3 too old for the preflight is a clear refusal that is not transient (not retried)."""
    env = image_env(tmp_path, interpreter(PYTHON37), "http://127.0.0.1:1/")
    flag, verdict, _ = run_script(shared, env)
    assert flag == f"{contract.FLAG_ENV}='0'\n"
    assert verdict["final"] is True and verdict["agent"] == {"asked": False}
    assert (
        verdict["reason"] == "the serving image's python (Python 3.7.16) is older than 3.8, which the preflight needs"
    )
    assert not operator_reads(verdict)["transient"]  # the operator rolls back instead of restarting the pod


def operator_reads(verdict: dict) -> dict:
    """What the operator's pod cache makes of this termination message (world.pod_view)."""
    import dataclasses

    from gluon_operator import webhook, world

    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1"},
        "status": {
            "initContainerStatuses": [
                {"name": webhook.PREFLIGHT_CONTAINER, "state": {"terminated": {"message": json.dumps(verdict)}}}
            ]
        },
    }
    return dataclasses.asdict(world.pod_view(pod))


def test_an_image_without_python_is_refused_finally(shared, tmp_path):
    env = {"PATH": str(tmp_path)}  # nothing on PATH: printf, [ and kill are the shell's builtins
    done = subprocess.run(
        ["/bin/dash", "-c", webhook_script(shared)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    verdict = json.loads((shared / "termination-log").read_text())
    assert verdict == {
        "flag": "0",
        "final": True,
        "agent": {"asked": False},
        "reason": "the serving image has no python3 on PATH",
    }


def webhook_script(shared, deadline_s=60):
    from gluon_operator import webhook

    return webhook.preflight_script(deadline_s, mount=str(shared), termination_log=str(shared / "termination-log"))


def test_a_hanging_python_is_killed_at_the_deadline(shared, tmp_path):
    """A python3 that hangs before any of our code runs (here: the image's sitecustomize) is bounded by the
    shell: '0' with the reason, within the deadline."""
    hang = write_tree(tmp_path / "hang", {"sitecustomize.py": "import time\ntime.sleep(120)\n"})
    env = image_env(tmp_path, sys.executable, "http://127.0.0.1:1/", [str(hang)])
    flag, verdict, seconds = run_script(shared, env, deadline_s=3)
    assert flag == f"{contract.FLAG_ENV}='0'\n"
    assert verdict == {"flag": "0", "reason": "the preflight passed its deadline of 3 s and was killed"}
    assert seconds < 10


class TricklingAgent:
    """A hostile agent on 127.0.0.1: it accepts, then sends one byte of an HTTP answer every `every` s."""

    def __init__(self, every: float = 0.5, limit_s: float = 30.0) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}{contract.DECISION_PATH}"
        self.every, self.limit_s, self.stop = every, limit_s, threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        self.sock.settimeout(self.limit_s)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Padding: " + b"x" * 1000
        with conn:
            for byte in answer:  # bounded: len(answer) bytes, at most limit_s seconds
                if self.stop.wait(self.every):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(5)


def timed_preflight(shared, agent_url: str, options: list[str], stack=()) -> tuple[dict, float]:
    """The preflight's Python alone (no shell watchdog): its verdict and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gluon_agent.preflight",
            "--flag-dir",
            str(shared),
            "--termination-log",
            str(shared / "termination-log"),
            "--agent-url",
            agent_url,
            *options,
        ],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join([str(shared / "lib"), *map(str, stack)])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((shared / "termination-log").read_text()), time.monotonic() - started


def test_a_trickling_agent_is_cut_at_the_agent_timeout(shared):
    """Each read gets a byte in time, so a per-read timeout alone never fires: the request has one limit."""
    agent = TricklingAgent()
    try:
        verdict, seconds = timed_preflight(shared, agent.url, ["--agent-timeout", "2", "--deadline", "20"])
    finally:
        agent.close()
    assert verdict["flag"] == "0" and "TimeoutError: no whole answer within 2 s" in verdict["reason"], verdict
    assert seconds < 8


def test_the_deadline_bounds_agent_and_probe_together(shared, tmp_path):
    """The agent's wait and the probe's share one deadline: a probe that hangs (aiter's import) ends with
    the deadline, not after the probe's own longer timeout."""
    from gluon_localcluster.fakes.stacks import failing_aiter

    agent = DecisionAgent({"flag": "1", "reason": "enabled", "current": True, "enabled": True})
    hanging = failing_aiter(tmp_path / "aiter", "hang")
    try:
        verdict, seconds = timed_preflight(shared, agent.url, ["--probe-timeout", "60", "--deadline", "6"], [hanging])
    finally:
        agent.close()
    assert verdict["flag"] == "0" and verdict["reason"].startswith("this image's stack is not capable"), verdict
    assert seconds < 12


class DecisionAgent:
    """A stand-in for the agent's /v1/decision with a fixed answer (for tests about the preflight's clock)."""

    def __init__(self, answer: dict) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        body = json.dumps(answer).encode()

        class Answer(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{contract.DECISION_PATH}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    "env,url",
    [
        ({"HOST_IP": "10.0.0.7"}, f"http://10.0.0.7:{contract.AGENT_PORT}{contract.DECISION_PATH}"),
        ({"HOST_IP": "fd00::7"}, f"http://[fd00::7]:{contract.AGENT_PORT}{contract.DECISION_PATH}"),
        (
            {"HOST_IP": "10.0.0.7", contract.ENV_PREFLIGHT_AGENT_URL: "http://10.0.0.7:9999/v1/decision"},
            "http://10.0.0.7:9999/v1/decision",
        ),
        ({}, None),
    ],
)
def test_the_agent_address(env, url, monkeypatch):
    from gluon_agent.preflight import default_agent_url

    for name in ("HOST_IP", contract.ENV_PREFLIGHT_AGENT_URL):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert default_agent_url() == url


def test_the_preflight_asks_the_agent_on_the_port_the_webhook_gives(shared, tmp_path):
    """issue 34: an agent on another port than 9477 (the chart's agent.port) is asked there, from HOST_IP."""
    from gluon_operator import webhook

    agent = DecisionAgent({"flag": "0", "reason": "held back for the test", "current": True, "enabled": False})
    try:
        port = agent.server.server_address[1]
        env = {**image_env(tmp_path, sys.executable, ""), "HOST_IP": "127.0.0.1"}
        del env[contract.ENV_PREFLIGHT_AGENT_URL]
        script = webhook.preflight_script(
            30, mount=str(shared), termination_log=str(shared / "termination-log"), agent_port=port
        )
        done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=shared)
        assert done.returncode == 0, done.stderr
        verdict = json.loads((shared / "termination-log").read_text())
    finally:
        agent.close()
    assert (
        verdict["agent"]["reason"] == "held back for the test"
        and verdict["reason"] == "agent says 0: held back for the test"
    ), verdict


# ---------------------------------------------------------------- the termination message's bound (issue 34)


LONG_REFUSAL = {
    "flag": "0",
    "seconds": 1.2,
    "agent": {
        "flag": "1",
        "reason": "enabled by rollout serving/kimi",
        "state": "Enabling",
        "node": "n1",
        "fingerprint": "fp",
        "current": True,
        "enabled": True,
    },
    "probe": {"capable": False, "summary": "aiter import failed", "missing_for_capable": ["aiter import"]},
    "reason": "this image's stack is not capable: aiter Gluon import: RuntimeError: " + 'triton < 3.6 \u00e9"\\ ' * 400,
}


@pytest.mark.parametrize(
    "verdict",
    [
        LONG_REFUSAL,
        {**LONG_REFUSAL, "final": True, "agent": {"asked": False}},
        {**LONG_REFUSAL, "agent": {**LONG_REFUSAL["agent"], "reason": "r" * 6000}, "reason": "short"},
    ],
)
def test_a_long_refusal_keeps_flag_final_and_agent_and_cuts_the_reason(verdict):
    from gluon_agent.preflight import TERMINATION_LIMIT, termination_message

    text = termination_message(verdict)
    assert len(json.dumps(verdict)) > TERMINATION_LIMIT >= len(text.encode())
    assert (
        len(text) > TERMINATION_LIMIT - 16 or verdict["reason"] == "short"
    )  # the reason is cut only as far as it must be
    kept = json.loads(text)
    assert kept["flag"] == "0" and kept["truncated"] is True and kept.get("final") == verdict.get("final")
    assert kept["agent"] == {k: v for k, v in verdict["agent"].items() if k in ("current", "enabled", "asked", "flag")}
    assert verdict["reason"].startswith(kept["reason"].removesuffix(" ..."))


def test_the_operator_reads_a_long_stack_refusal_as_a_refusal_not_as_transient():
    """An aiter import raising a 5 KB RuntimeError: read as transient, the pod was restarted every 15 s and
    the node stayed Enabling instead of rolling back."""
    from gluon_agent.preflight import termination_message
    from gluon_operator import world

    for verdict, transient in (
        (LONG_REFUSAL, False),
        ({**LONG_REFUSAL, "agent": {**LONG_REFUSAL["agent"], "current": False}}, True),
        ({**LONG_REFUSAL, "agent": None}, True),
        ({**LONG_REFUSAL, "final": True, "agent": {"asked": False}}, False),
    ):
        status = {
            "initContainerStatuses": [
                {"name": "gluon-preflight", "state": {"terminated": {"message": termination_message(verdict)}}}
            ]
        }
        pod = {
            "metadata": {"name": "p", "namespace": "x", "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": {"nodeName": "n1"},
            "status": status,
        }
        view = world.pod_view(pod)
        assert (
            view.flag == "0"
            and view.transient is transient
            and view.preflight_reason.startswith("this image's stack is not capable")
        )


def test_the_preflight_names_its_own_pod_to_the_agent():
    environ = {
        contract.ENV_PREFLIGHT_POD_NAMESPACE: "inference",
        contract.ENV_PREFLIGHT_POD_NAME: "sglang-0",
        contract.ENV_PREFLIGHT_POD_UID: "1234-ab",
    }
    url = "http://10.0.0.1:9477" + contract.DECISION_PATH
    assert preflight.asking_url(url, environ) == url + "?namespace=inference&name=sglang-0&uid=1234-ab"
    assert preflight.asking_url(url + "?x=1", environ).startswith(url + "?x=1&namespace=")
    assert preflight.asking_url(url, {}) == url and preflight.asking_url(None, environ) is None
