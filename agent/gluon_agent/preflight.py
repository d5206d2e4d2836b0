"""`gluon-agent preflight`: runs as an init container *in the serving image* (stdlib only, any python3).

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
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from . import contract
from .probe import probe

FLAG_FILE_NAME = "flag.env"
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096  # the kubelet keeps at most this much of a termination message
# The modules the preflight needs in a foreign image: all stdlib-only.
PORTABLE_MODULES = ("__init__.py", "contract.py", "isolation.py", "probe.py", "probe_child.py", "preflight.py", "sglang_routes.py")


def flag_line(value: str) -> str:
    return f"{contract.FLAG_ENV}='{value}'\n"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def install(target: Path) -> None:
    """Copy the preflight package into `target/lib` and write the safe default flag."""
    package = target / "lib" / "gluon_agent"
    package.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).parent
    for name in PORTABLE_MODULES:
        shutil.copyfile(here / name, package / name)
    write_atomically(target / FLAG_FILE_NAME, flag_line("0"))


def ask_agent(url: str, timeout: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - http to the node's agent
        return json.loads(response.read())


def decide(agent_url: str | None, agent_timeout: float, probe_timeout: float) -> dict[str, Any]:
    """The verdict: flag '1' only when the agent says so and this image's stack is capable."""
    started = time.monotonic()
    verdict: dict[str, Any] = {"flag": "0", "agent": None, "probe": None}
    if not agent_url:
        return verdict | {"reason": "no agent address (HOST_IP unset)"}
    try:
        answer = ask_agent(agent_url, agent_timeout)
    except Exception as exc:  # noqa: BLE001 - unreachable, slow, 503 or garbage: all mean '0'
        return verdict | {"reason": f"agent at {agent_url} did not answer: {type(exc).__name__}: {exc}"}
    # current/enabled let the operator tell "the agent had not seen the enable yet" (retry) from a refusal
    verdict["agent"] = {k: answer.get(k) for k in ("flag", "reason", "state", "node", "fingerprint", "current", "enabled")}
    report = probe(timeout=probe_timeout)
    verdict["probe"] = {k: report.get(k) for k in ("capable", "summary", "missing_for_capable", "triton_version", "aiter_version")}
    verdict["seconds"] = round(time.monotonic() - started, 3)
    if answer.get("flag") != "1":
        return verdict | {"reason": f"agent says 0: {answer.get('reason')}"}
    if not report.get("capable"):
        return verdict | {"reason": "this image's stack is not capable: " + "; ".join(report.get("missing_for_capable", []))}
    return verdict | {"flag": "1", "reason": f"agent says 1 ({answer.get('reason')}) and this image is capable"}


def termination_message(verdict: dict[str, Any]) -> str:
    text = json.dumps(verdict, sort_keys=True)
    if len(text) > TERMINATION_LIMIT:  # drop the details before the decision
        text = json.dumps({"flag": verdict["flag"], "reason": str(verdict.get("reason"))[:TERMINATION_LIMIT - 100]})
    return text


def run(flag_dir: Path, agent_url: str | None, agent_timeout: float, probe_timeout: float, termination_log: Path) -> dict[str, Any]:
    try:
        verdict = decide(agent_url, agent_timeout, probe_timeout)
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


def default_agent_url() -> str | None:
    host = os.environ.get("HOST_IP")
    return f"http://{host}:{contract.AGENT_PORT}{contract.DECISION_PATH}" if host else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gluon-agent preflight", description=__doc__)
    parser.add_argument("--install", metavar="DIR", help="copy the preflight into DIR and write the default flag")
    parser.add_argument("--flag-dir", default="/gluon", help="the shared emptyDir")
    parser.add_argument("--agent-url", default=default_agent_url())
    parser.add_argument("--agent-timeout", type=float, default=3.0)
    parser.add_argument("--probe-timeout", type=float, default=60.0)
    parser.add_argument("--termination-log", default=TERMINATION_LOG)
    args = parser.parse_args(argv)
    if args.install:
        install(Path(args.install))
        return 0
    run(Path(args.flag_dir), args.agent_url, args.agent_timeout, args.probe_timeout, Path(args.termination_log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
