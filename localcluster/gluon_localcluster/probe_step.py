"""`make demo`'s first step: `gluon-agent probe` on this machine, said plainly.

The probe exits 1 when the machine is not capable, which on a machine without an AMD GPU is the expected
answer, not a failure: this step prints the probe's table and one sentence saying which case it is, and
exits 0 for every answer the probe gave (capable or not). A probe that crashed (any other exit code, or
no readable report) is a real failure: the step says so and exits non-zero, so `make demo` stops there.

    python -m gluon_localcluster.probe_step
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PROBE_EXIT_CAPABLE, PROBE_EXIT_NOT_CAPABLE = 0, 1  # gluon-agent's documented exit codes for `probe`


def verdict(returncode: int, stdout: str, stderr: str = "") -> tuple[str, int, dict[str, Any] | None]:
    """(the sentence to print, this step's exit code, the probe's report or None) for one probe run."""
    if returncode not in (PROBE_EXIT_CAPABLE, PROBE_EXIT_NOT_CAPABLE):
        return f"the probe crashed (exit {returncode}): {_tail(stderr or stdout)}", returncode or 1, None
    try:
        report = json.loads(stdout)
        capable, gpus = bool(report["capable"]), list(report["gpus"])
    except (ValueError, KeyError, TypeError) as error:
        return f"the probe gave no readable report ({error!r}): {_tail(stdout)}", 1, None
    if capable:
        return "this machine's GPUs can run the Gluon MLA decode path (capable).", 0, report
    missing = "; ".join(report.get("missing_for_capable") or []) or "see above"
    if not gpus:
        return (
            f"this machine has no AMD GPU (/dev/kfd {report.get('kfd_access') or 'absent'}), so the probe says "
            "'not capable', as expected here. The demo's GPU nodes below are a SIMULATION.",
            0,
            report,
        )
    archs = ", ".join(sorted({str(g.get("arch")) for g in gpus}))
    return f"this machine's GPUs ({archs}) are not capable: {missing}. The demo runs on simulated nodes.", 0, report


def _tail(text: str, limit: int = 600) -> str:
    return " ".join(text.strip().splitlines()[-5:])[-limit:] or "(no output)"


def main() -> int:
    agent = Path(sys.executable).parent / "gluon-agent"  # the console script the venv installed
    done = subprocess.run([str(agent), "probe", "--json"], capture_output=True, text=True)
    sentence, code, report = verdict(done.returncode, done.stdout, done.stderr)
    if report is not None:
        from gluon_agent.probe import format_table

        print(format_table(report))
    print(f"=> {sentence}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
