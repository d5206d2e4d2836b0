"""Which decode routes the serving image's SGLang takes for Kimi-K3 (12 heads zero-padded to 16, fp8 KV,
`--attention-backend aiter`), from what probe_child's `sglang` check read there. Pure and stdlib only.

Upstream facts (sgl-project/sglang; PR threads and code read 2026-12-01):
- PR #34647 (merged to main 2026-09-01) added aiter_mla_gluon.py and, in AiterAttnBackend.__init__,
  turned the persistent MLA kernel off for every zero-pad fp8 12-head setup. With the flag at 0 SGLang
  then asks aiter for the non-persistent bf16-q / fp8-KV 16-head kernel, which aiter does not ship:
  "cannot get heuristic kernel! q_type:bf16 kv_type:fp8 gqa:16 ps:0 ... Fatal Python error: Aborted"
  (the crash reported in PR #37438).
- PR #37438 (main, commit 44a92e54) keeps persistent on unless Gluon is selected: the init-time
  `if prefer_mla_gluon_decode(head_pad_mode=...)` guard (aiter_backend.py at 003c5589). PR #37856
  cherry-picked it to release/v0.5.19 on 2026-09-03, before v0.5.19 was published (tag 0bcd8223), so
  v0.5.19 is the first release with the Gluon path whose flag-0 route is safe. v0.5.18 (2026-08-25)
  predates #34647: no Gluon path at all, the flag does nothing there.
- PR #37601 (main, 2026-09-02) routes q_len > 1 through mla_gluon (`qlen` in mla_gluon_decode); it is
  not among the v0.5.19 cherry-picks found (#37855, #37856, #37857, #37861, #37863), so only the source
  tells whether an image has it.
Main-branch builds between #34647 and #37438 may carry any version string, so the installed source decides
when it is readable; the version decides only when it is not (or when it is newer than the markers know).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

MINIMUM_VERSION = "0.5.19"
FIRST_FIXED_VERSION = "0.5.19"
GLUON_PR, FIX_PR, BACKPORT_PR, MTP_PR = 34647, 37438, 37856, 37601
NEWER_THAN_MARKERS = (0, 5, 20)  # any build from 0.5.20 on comes after #37438 on main

PERSISTENT, ABORTS, NO_GLUON, UNKNOWN = "persistent", "aborts", "no-gluon", "unknown"
VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(.*)$")


def parse_version(text: str | None) -> tuple[tuple[int, int, int], bool] | None:
    """((major, minor, patch), final) where final means a release or .postN, not a dev/rc build."""
    match = VERSION_RE.match((text or "").strip())
    if not match:
        return None
    rest = match.group(4)
    final = rest == "" or re.fullmatch(r"\.post\d+(\+.*)?|\+.*", rest) is not None
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))), final


def _fixed_by_version(version: str | None) -> bool:
    parsed = parse_version(version)
    if parsed is None:
        return False
    release, final = parsed
    return release >= NEWER_THAN_MARKERS or (release >= (0, 5, 19) and final)


def _newer_than_markers(version: str | None) -> bool:
    parsed = parse_version(version)
    return parsed is not None and parsed[0] >= NEWER_THAN_MARKERS


def _before_gluon_by_version(version: str | None) -> bool:
    parsed = parse_version(version)
    return parsed is not None and parsed[0] < (0, 5, 19)


def decode_routes(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The routes the probed SGLang takes, with the evidence. `facts` is probe_child's sglang result."""
    version = facts.get("sglang_version")
    if not version and not facts.get("source_found"):
        return {"version": None, "flag0_route": UNKNOWN, "mtp_through_gluon": None,
                "evidence": "no SGLang installed in the probed interpreter"}
    if facts.get("source_found"):
        if not facts.get("gluon_module"):
            route, evidence = NO_GLUON, f"no aiter_mla_gluon.py: SGLang before PR #{GLUON_PR}, the flag has no effect"
        elif facts.get("flag0_persistent_guard"):
            route, evidence = PERSISTENT, f"aiter_backend.py turns persistent MLA off only when Gluon is selected (PR #{FIX_PR})"
        elif _newer_than_markers(version):  # the code moved on; main had #37438 long before 0.5.20
            route, evidence = PERSISTENT, f"version {version} is newer than PR #{FIX_PR}"
        else:
            route, evidence = ABORTS, (f"aiter_mla_gluon.py present (PR #{GLUON_PR}) without PR #{FIX_PR}'s guard in "
                                       "aiter_backend.py: persistent MLA is off for the zero-pad fp8 case")
        mtp = bool(facts.get("mtp_qlen"))
        evidence += f"; mla_gluon_decode {'takes' if mtp else 'lacks'} qlen (PR #{MTP_PR})"
        return {"version": version, "flag0_route": route, "mtp_through_gluon": mtp, "evidence": evidence}
    if _fixed_by_version(version):
        route = PERSISTENT
    elif _before_gluon_by_version(version):
        route = NO_GLUON
    else:
        route = UNKNOWN
    return {"version": version, "flag0_route": route, "mtp_through_gluon": None,
            "evidence": f"source unreadable; from version {version} alone"}


def flag0_failure(routes: Mapping[str, Any] | None) -> str | None:
    """Why the fallback must fail on this node: its SGLang's flag-0 route is known to abort."""
    if not routes or routes.get("flag0_route") != ABORTS:
        return None
    return (f"SGLang {routes.get('version') or '(unknown version)'} aborts at SGLANG_AITER_MLA_GLUON=0: it turns "
            f"the persistent MLA kernel off and asks aiter for a non-persistent bf16/fp8 16-head kernel aiter does "
            f"not ship (PR #{GLUON_PR} without PR #{FIX_PR}; first fixed in v{FIRST_FIXED_VERSION} by PR #{BACKPORT_PR})")
