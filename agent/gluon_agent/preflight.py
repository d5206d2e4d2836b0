"""`gluon-agent preflight`: runs as an init container *in the serving image* (stdlib only, python3 >= 3.8).

Two steps, two init containers (the webhook injects both):
  1. `--install DIR` (agent image): copy this stdlib-only code into the shared emptyDir and write the
     safe default flag file ('0'), so the serving container starts on the safe path whatever happens next.
  2. (serving image) ask the node's agent for its decision, re-probe aiter/Triton *in this image*, and
     write SGLANG_AITER_MLA_GLUON='1' only if both say yes, else '0'. The JSON verdict goes to the
     termination message, where the operator reads it. Any failure writes '0' and exits 0: a serving
     pod never fails to start because of us.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Sequence

import gluon_common
from gluon_common import contract

from .probe import REQUIRED_ARCH, Facts, missing_for_capable, probe

FLAG_FILE_NAME = contract.FLAG_FILE
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096  # the kubelet keeps at most this much of a termination message
DEFAULT_DEADLINE_S = 80.0  # the webhook passes its own (its shell's deadline less a grace)
PROBE_MARGIN_S = 2.0  # of the deadline, kept for writing the verdict after the probe
ANSWER_LIMIT = 64 * 1024  # the agent's decision is a few hundred bytes
# A set of modules to copy into a foreign image: package (dotted, e.g. "gluon_agent.selftest") -> its files.
ModuleSet = Mapping[str, Sequence[str]]
# The modules the preflight needs in a foreign image, by package: all stdlib-only.
PORTABLE_MODULES: ModuleSet = {
    "gluon_agent": ("__init__.py", "isolation.py", "probe.py", "probe_child.py", "preflight.py"),
    "gluon_common": ("__init__.py", "contract.py", "sglang_env.py", "sglang_routes.py"),
}


def package_folder(package: str) -> Path:
    """This install's folder of `package` (gluon_agent, gluon_common or one of their subpackages)."""
    root, *subpackages = package.split(".")
    roots = {"gluon_agent": Path(__file__).parent, "gluon_common": Path(gluon_common.__file__).parent}
    return roots[root].joinpath(*subpackages)


def portable_sources(modules: ModuleSet = PORTABLE_MODULES) -> list[tuple[Path, str]]:
    """(this install's file, its path under the copy's lib/) for every module of `modules`."""
    return [
        (package_folder(package) / name, "/".join([*package.split("."), name]))
        for package, names in modules.items()
        for name in names
    ]


def copy_modules(target: Path, modules: ModuleSet = PORTABLE_MODULES) -> None:
    """Copy `modules` into `target/lib`, the folder a foreign image's python3 gets as its PYTHONPATH."""
    for source, relative in portable_sources(modules):
        copy = target / "lib" / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)


def flag_line(value: str) -> str:
    return f"{contract.FLAG_ENV}='{value}'\n"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def install(target: Path) -> None:
    """Copy the preflight package into `target/lib` and write the safe default flag."""
    copy_modules(target, PORTABLE_MODULES)
    write_atomically(target / FLAG_FILE_NAME, flag_line("0"))


class Deadline:
    """One deadline for the whole preflight (the shell around it enforces a later one from outside)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())


def fetch_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - http to the node's agent
        body = response.read(ANSWER_LIMIT + 1)
    if len(body) > ANSWER_LIMIT:
        raise ValueError(f"the answer is longer than {ANSWER_LIMIT} bytes")
    return json.loads(body)


def ask_agent(url: str, timeout: float) -> dict[str, Any]:
    """The agent's decision within `timeout` seconds in all. A socket timeout bounds each read only, so an
    agent trickling a byte at a time would hold a plain read for ever: the request runs in a daemon
    thread that is abandoned at the deadline."""
    outcome: dict[str, Any] = {}

    def fetch() -> None:
        try:
            outcome["answer"] = fetch_json(url, timeout)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    worker = threading.Thread(target=fetch, name="ask-agent", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"no whole answer within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    answer = outcome["answer"]
    if not isinstance(answer, dict):
        raise ValueError(f"the answer is a JSON {type(answer).__name__}, not an object")
    return answer


def stack_problems(report: Mapping[str, Any]) -> list[str]:
    """What this image's software lacks, in the probe's own words. The GPUs are the agent's part (its
    self-test ran on them): an init container is given no GPU by the device plugin, so the probe here
    sees none, and that must not refuse a healthy stack."""
    facts = Facts(
        enabled_by_env=True,
        import_ok=bool(report.get("import_ok")),
        triton_version=report.get("triton_version"),
        triton_cga_layout_ok=bool(report.get("triton_cga_layout_ok")),
        gpu_archs=(REQUIRED_ARCH,),
        fp8_e4m3fn_ok=bool(report.get("fp8_e4m3fn_ok")),
    )
    return missing_for_capable(facts)


def decide(agent_url: str | None, agent_timeout: float, probe_timeout: float, deadline: Deadline) -> dict[str, Any]:
    """The verdict: flag '1' only when the agent says so and this image's stack is capable."""
    started = time.monotonic()
    verdict: dict[str, Any] = {"flag": "0", "agent": None, "probe": None}
    if not agent_url:
        return {**verdict, "reason": "no agent address (HOST_IP unset)"}
    try:
        answer = ask_agent(agent_url, min(agent_timeout, deadline.left()))
    except Exception as exc:  # noqa: BLE001 - unreachable, slow, 503 or garbage: all mean '0'
        return {**verdict, "reason": f"agent at {agent_url} did not answer: {type(exc).__name__}: {exc}"}
    # current/enabled let the operator tell "the agent had not seen the enable yet" (retry) from a refusal
    verdict["agent"] = {
        k: answer.get(k)
        for k in ("flag", "reason", "state", "node", "fingerprint", "current", "enabled", "proved", "image")
    }
    budget = min(probe_timeout, deadline.left() - PROBE_MARGIN_S)
    if budget <= 0:
        return {
            **verdict,
            "reason": f"the preflight's deadline of {deadline.seconds:g} s left no time to probe this image",
        }
    report = probe(timeout=budget)
    verdict["probe"] = {
        k: report.get(k) for k in ("capable", "summary", "missing_for_capable", "triton_version", "aiter_version")
    }
    verdict["seconds"] = round(time.monotonic() - started, 3)
    if answer.get("flag") != "1":
        return {**verdict, "reason": f"agent says 0: {answer.get('reason')}"}
    problems = stack_problems(report)
    if problems:
        return {**verdict, "reason": "this image's stack is not capable: " + "; ".join(problems)}
    return {**verdict, "flag": "1", "reason": f"agent says 1 ({answer.get('reason')}) and this image is capable"}


# What the operator decides on besides flag and reason: `final` and these fields of `agent` tell a refusal
# by the stack (the node rolls back) from the agent's view not having caught up yet (the pod restarts).
DECIDING_AGENT_KEYS = ("current", "enabled", "asked", "flag", "proved")


def termination_message(verdict: dict[str, Any]) -> str:
    """The verdict as JSON within TERMINATION_LIMIT bytes (json.dumps writes ASCII: a byte a character).
    Too long, the details are dropped first, then the reason is cut: `flag`, `final` and the deciding
    fields of `agent` are always kept, so a long refusal is never read as transient."""
    text = json.dumps(verdict, sort_keys=True)
    if len(text) <= TERMINATION_LIMIT:
        return text
    short: dict[str, Any] = {"flag": verdict["flag"], "truncated": True}
    if "final" in verdict:
        short["final"] = verdict["final"]
    agent = verdict.get("agent")
    if "agent" in verdict:
        short["agent"] = (
            {
                k: agent[k]
                for k in DECIDING_AGENT_KEYS
                if k in agent and isinstance(agent[k], (bool, str, type(None))) and len(str(agent[k])) <= 8
            }
            if isinstance(agent, dict)
            else None
        )
    reason = str(verdict.get("reason"))
    text = json.dumps({**short, "reason": reason}, sort_keys=True)
    if len(text) <= TERMINATION_LIMIT:
        return text
    fits, cut = 0, len(reason)  # the longest prefix of the reason whose message fits: a binary search
    while fits < cut:
        middle = (fits + cut + 1) // 2
        if len(json.dumps({**short, "reason": reason[:middle] + " ..."}, sort_keys=True)) <= TERMINATION_LIMIT:
            fits = middle
        else:
            cut = middle - 1
    return json.dumps({**short, "reason": reason[:fits] + " ..."}, sort_keys=True)


def run(
    flag_dir: Path,
    agent_url: str | None,
    agent_timeout: float,
    probe_timeout: float,
    termination_log: Path,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> dict[str, Any]:
    try:
        verdict = decide(agent_url, agent_timeout, probe_timeout, Deadline(deadline_s))
    except Exception as exc:  # noqa: BLE001 - a surprise is '0' too
        verdict = {"flag": "0", "reason": f"preflight failed: {type(exc).__name__}: {exc}"}
    try:
        write_atomically(flag_dir / FLAG_FILE_NAME, flag_line(verdict["flag"]))
    except OSError as exc:
        verdict = {"flag": "0", "reason": f"could not write the flag file: {exc}"}
    try:
        termination_log.write_text(termination_message(verdict))
    except OSError:
        pass  # the flag file is what matters; the operator then sees no verdict and labels nothing
    print(json.dumps(verdict))
    return verdict


def default_agent_url(port: int = contract.AGENT_PORT) -> str | None:
    """The node's agent: the whole URL the env var gives, else HOST_IP at `port` (the chart's agent.port,
    which the webhook passes as --agent-port)."""
    if os.environ.get(contract.ENV_PREFLIGHT_AGENT_URL):
        return os.environ[contract.ENV_PREFLIGHT_AGENT_URL]
    host = os.environ.get("HOST_IP")
    if host and ":" in host:  # an IPv6 node address (status.hostIP on an IPv6 cluster) needs brackets in a URL
        host = f"[{host}]"
    return f"http://{host}:{port}{contract.DECISION_PATH}" if host else None


def asking_url(url: str | None, environ: Mapping[str, str]) -> str | None:
    """The agent's URL with this preflight's own pod (the webhook's downward-API env) as its query: an agent that
    answers per image reads that pod's status for the digest its runtime resolved."""
    pod = {
        "namespace": environ.get(contract.ENV_PREFLIGHT_POD_NAMESPACE),
        "name": environ.get(contract.ENV_PREFLIGHT_POD_NAME),
        "uid": environ.get(contract.ENV_PREFLIGHT_POD_UID),
    }
    query = urllib.parse.urlencode({k: v for k, v in pod.items() if v})
    if url is None or not query:
        return url
    return f"{url}{'&' if '?' in url else '?'}{query}"


def port_number(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1-65535)")
    return port


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gluon-agent preflight", description=__doc__)
    parser.add_argument("--install", metavar="DIR", help="copy the preflight into DIR and write the default flag")
    parser.add_argument("--flag-dir", default=contract.FLAG_MOUNT, help="the shared emptyDir")
    parser.add_argument("--agent-url", default=None, help="default: http://$HOST_IP:PORT" + contract.DECISION_PATH)
    parser.add_argument("--agent-port", type=port_number, default=contract.AGENT_PORT, help="the node's agent's port")
    # the agent may wait up to 3 s for the kubelet to report this container's image (per-image answers)
    parser.add_argument("--agent-timeout", type=float, default=6.0)
    parser.add_argument("--probe-timeout", type=float, default=60.0)
    parser.add_argument("--termination-log", default=TERMINATION_LOG)
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds for the whole preflight")
    args = parser.parse_args(argv)
    if args.install:
        install(Path(args.install))
        return 0
    run(
        Path(args.flag_dir),
        asking_url(args.agent_url or default_agent_url(args.agent_port), os.environ),
        args.agent_timeout,
        args.probe_timeout,
        Path(args.termination_log),
        args.deadline,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
