"""On a CUDA device: the capture guard sees what our adapters do inside graph capture, and sees it fail.

Runs each aiter adapter (with the aiter stand-in on PYTHONPATH) under a real torch.cuda.graph capture
with the CaptureGuard on, then two deliberately wrong adapters (a host-to-device scale copy, as the
fallback adapter once made, and work metadata allocated inside the capture) to prove the guard catches
them. Prints one JSON object; exits 1 if our adapters are flagged or a wrong one is not.

    PYTHONPATH=localcluster/gluon_localcluster/fakes/aiter_stack:common:agent python3 bench/capture_check.py
"""

from __future__ import annotations

import json
import sys

import torch

from gluon_agent.selftest import timing
from gluon_agent.selftest.backends import BACKEND_SETS, Call, Serving, ZeroPadCall
from gluon_agent.selftest.capture_guard import CaptureGuard
from gluon_agent.selftest.problem import make_problem


class HostScaleCopy(ZeroPadCall):
    """The old fallback adapter's mistake: the k scale built from a host float on every call."""

    def launch(self, out):
        self.k_scale = torch.tensor([self.p.kv_scale], dtype=torch.float32, device=self.p.q.device)
        super().launch(out)


class MetadataInCapture(ZeroPadCall):
    """Work metadata sized and filled inside the launch (so inside the capture)."""

    def launch(self, out):
        self.meta = {name: torch.empty_like(buffer) for name, buffer in self.meta.items()}
        super().launch(out)


def guarded(bound, out) -> dict:
    guard = CaptureGuard()
    bound.refresh()
    try:
        timing.capture([lambda: bound.launch(out)], guard=guard)
        error = None
    except Exception as exc:  # noqa: BLE001 - CUDA's own refusal is a finding too
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    return {"violations": guard.violations, "capture_error": error}


def main() -> int:
    device = torch.device("cuda")
    p = make_problem([4097, 129, 1, 9000], device=device, seed=5)
    call, serving = Call(max_kv_len=9000, capturing=True), Serving()
    results = {}
    for path, backend in BACKEND_SETS["aiter"].items():
        results[backend.name] = guarded(backend.bind(p, call, serving), p.new_output())
    for wrong in (HostScaleCopy, MetadataInCapture):
        results[wrong.__name__] = guarded(wrong(p, call, serving), p.new_output())
        torch.cuda.synchronize()
    ours_clean = all(
        not r["violations"] and not r["capture_error"] for n, r in results.items() if n.startswith("aiter")
    )
    wrong_caught = all(r["violations"] or r["capture_error"] for n, r in results.items() if not n.startswith("aiter"))
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(device),
                "torch": torch.__version__,
                "results": results,
                "ours_clean": ours_clean,
                "wrong_caught": wrong_caught,
            },
            indent=2,
        )
    )
    return 0 if ours_clean and wrong_caught else 1


if __name__ == "__main__":
    sys.exit(main())
