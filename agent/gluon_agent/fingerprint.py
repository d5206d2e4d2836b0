"""The software fingerprint a self-test verdict belongs to. Stdlib only.

Any change (driver, ROCm/HIP, torch, Triton, aiter, the serving SGLang's version, GPU arch or identity,
our portable kernel) makes
a new fingerprint: old verdicts no longer count and the agent tests again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

KERNEL_SOURCE = Path(__file__).parent / "selftest" / "triton_mla.py"


def kernel_source_hash() -> str:
    return hashlib.sha256(KERNEL_SOURCE.read_bytes()).hexdigest()[:16]


def fingerprint_parts(probe_report: dict[str, Any]) -> dict[str, Any]:
    return {
        "driver": probe_report.get("driver_version"),
        "hip": probe_report.get("hip_version"),
        "cuda": probe_report.get("cuda_version"),
        "torch": probe_report.get("torch_version"),
        "triton": probe_report.get("triton_version"),
        "aiter": probe_report.get("aiter_version"),
        "sglang": (probe_report.get("sglang") or {}).get("version"),  # its decode routes decide the fallback
        "gpus": [[g.get("arch"), g.get("name"), g.get("uuid")] for g in probe_report.get("gpus", [])],
        "kernel": kernel_source_hash(),
    }


def fingerprint(probe_report: dict[str, Any]) -> str:
    canonical = json.dumps(fingerprint_parts(probe_report), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
