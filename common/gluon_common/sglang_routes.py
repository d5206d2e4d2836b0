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

import hashlib
import json
import re
from dataclasses import dataclass
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
        return {
            "version": None,
            "flag0_route": UNKNOWN,
            "mtp_through_gluon": None,
            "evidence": "no SGLang installed in the probed interpreter",
        }
    if facts.get("source_found"):
        if not facts.get("gluon_module"):
            route, evidence = NO_GLUON, f"no aiter_mla_gluon.py: SGLang before PR #{GLUON_PR}, the flag has no effect"
        elif facts.get("flag0_persistent_guard"):
            route, evidence = (
                PERSISTENT,
                f"aiter_backend.py turns persistent MLA off only when Gluon is selected (PR #{FIX_PR})",
            )
        elif _newer_than_markers(version):  # the code moved on; main had #37438 long before 0.5.20
            route, evidence = PERSISTENT, f"version {version} is newer than PR #{FIX_PR}"
        else:
            route, evidence = (
                ABORTS,
                (
                    f"aiter_mla_gluon.py present (PR #{GLUON_PR}) without PR #{FIX_PR}'s guard in "
                    "aiter_backend.py: persistent MLA is off for the zero-pad fp8 case"
                ),
            )
        mtp = bool(facts.get("mtp_qlen"))
        evidence += f"; mla_gluon_decode {'takes' if mtp else 'lacks'} qlen (PR #{MTP_PR})"
        return {"version": version, "flag0_route": route, "mtp_through_gluon": mtp, "evidence": evidence}
    if _fixed_by_version(version):
        route = PERSISTENT
    elif _before_gluon_by_version(version):
        route = NO_GLUON
    else:
        route = UNKNOWN
    return {
        "version": version,
        "flag0_route": route,
        "mtp_through_gluon": None,
        "evidence": f"source unreadable; from version {version} alone",
    }


def flag0_failure(routes: Mapping[str, Any] | None) -> str | None:
    """Why the fallback must fail on this node: its SGLang's flag-0 route is known to abort."""
    if not routes or routes.get("flag0_route") != ABORTS:
        return None
    return (
        f"SGLang {routes.get('version') or '(unknown version)'} aborts at SGLANG_AITER_MLA_GLUON=0: it turns "
        f"the persistent MLA kernel off and asks aiter for a non-persistent bf16/fp8 16-head kernel aiter does "
        f"not ship (PR #{GLUON_PR} without PR #{FIX_PR}; first fixed in v{FIRST_FIXED_VERSION} by PR #{BACKPORT_PR})"
    )


# ---------------------------------------------------------------- the serving configuration and its routes
# Which kernel each flag runs, per q_len, from the serving SGLang (decode_routes above) and how it is
# launched. Upstream evidence (sgl-project/sglang aiter_backend.py at 003c5589, aiter_mla_gluon.py at
# 2ee4570a, PRs #34432 and #40750; ROCm/aiter e4048607 hsa/gfx950/mla/mla_asm.csv and asm_mla.cu):
# - flag 1 selects Gluon (prefer_mla_gluon_decode: zero pad, 12 heads, fp8 KV, import and cga ok) and
#   __init__ then turns persistent MLA off; q_len 1 runs mla_gluon, q_len > 1 runs mla_gluon only with
#   PR #37601, else the non-persistent mla_decode_fwd;
# - flag 0 runs mla_decode_fwd, persistent unless SGLANG_AITER_MLA_PERSIST=0 or the build predates
#   PR #37438 (then non-persistent);
# - with DCP (dcp_world_size > 1) decode always uses Gluon, and with the flag off newer builds raise
#   "AITER Gluon MLA is required for DCP"; PR #40750's SGLANG_AITER_MLA_DCP_DECODE_BACKEND=asm runs
#   the persistent mla_decode_fwd instead, decode (q_len 1) only: fast-mode metadata (fast_mode=True,
#   intra_batch_mode=False), the all-gathered q quantized to fp8, return_lse=True (its description);
#   target verify under DCP stays on Gluon (PR #34537 would add an asm one);
# - on gfx950 the only bf16-q / fp8-KV 16-head kernel is persistent with qSeqLen 4 (bf16,fp8,16,1,4),
#   and asm_mla.cu pads q_len up to 4 only: non-persistent, or q_len 5 and more, has no kernel.
MAX_PADDED_Q_LEN = 4
DCP_REFUSAL = "RuntimeError: AITER Gluon MLA is required for DCP (aiter_mla_gluon.py with SGLANG_AITER_MLA_GLUON=0)"


@dataclass(frozen=True)
class ServingConfig:
    """What of a serving pod's SGLang setup decides its decode routes."""

    verify_q_lens: tuple[int, ...] = ()  # speculative decoding's target-verify q_len(s); () = none
    dcp_size: int = 1
    dcp_decode_backend: str = "gluon"  # SGLANG_AITER_MLA_DCP_DECODE_BACKEND (PR #40750)
    persist: bool = True  # SGLANG_AITER_MLA_PERSIST
    page_size: int = 1
    dp_attention: bool = False

    @property
    def q_lens(self) -> tuple[int, ...]:
        return (1, *sorted(set(self.verify_q_lens) - {1}))

    def as_dict(self) -> dict[str, Any]:
        return {
            "verifyQLens": list(self.verify_q_lens),
            "dcpSize": self.dcp_size,
            "dcpDecodeBackend": self.dcp_decode_backend,
            "persist": self.persist,
            "pageSize": self.page_size,
            "dpAttention": self.dp_attention,
        }

    @property
    def digest(self) -> str:
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "serving config") -> "ServingConfig":
        """The config from its JSON form; a clear ValueError naming the field for anything else."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: must be an object, got {type(data).__name__}")
        unknown = set(data) - set(cls().as_dict())
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")

        def integer(name: str, default: int, low: int, high: int) -> int:
            value = data.get(name, default)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{where}.{name}: must be an integer from {low} to {high}, got {value!r}")
            return value

        def flag(name: str, default: bool) -> bool:
            value = data.get(name, default)
            if not isinstance(value, bool):
                raise ValueError(f"{where}.{name}: must be true or false, got {value!r}")
            return value

        q_lens = data.get("verifyQLens", [])
        if (
            not isinstance(q_lens, list)
            or len(q_lens) > 8
            or any(isinstance(q, bool) or not isinstance(q, int) or not 2 <= q <= MAX_VERIFY_Q_LEN for q in q_lens)
        ):
            raise ValueError(f"{where}.verifyQLens: at most 8 integers from 2 to {MAX_VERIFY_Q_LEN}, got {q_lens!r}")
        backend = data.get("dcpDecodeBackend", "gluon")
        if backend not in ("gluon", "asm"):
            raise ValueError(f"{where}.dcpDecodeBackend: must be 'gluon' or 'asm', got {backend!r}")
        page = integer("pageSize", 1, 1, 4096)
        if page & (page - 1):
            raise ValueError(f"{where}.pageSize: must be a power of 2, got {page}")
        return cls(
            verify_q_lens=tuple(sorted(set(q_lens))),
            dcp_size=integer("dcpSize", 1, 1, 64),
            dcp_decode_backend=backend,
            persist=flag("persist", True),
            page_size=page,
            dp_attention=flag("dpAttention", False),
        )


MAX_VERIFY_Q_LEN = 16
DEFAULT_SERVING = ServingConfig(verify_q_lens=(2, 3, 4))  # until the operator says what its pods serve


def _route(kernel: str, persistent: bool, evidence: str, q_len: int, refusal: str | None = None) -> dict[str, Any]:
    aborts = refusal
    if aborts is None and kernel == "mla_decode_fwd" and (not persistent or q_len > MAX_PADDED_Q_LEN):
        aborts = (
            f"no gfx950 kernel for bf16 q / fp8 KV / 16 heads, {'persistent' if persistent else 'non-persistent'}, "
            f"q_len {q_len} (mla_asm.csv has only bf16,fp8,16,1,4; asm_mla.cu pads q_len up to 4)"
        )
    return {
        "kernel": "refused" if refusal else kernel,
        "persistent": persistent,
        "evidence": evidence,
        "aborts": aborts,
        "refusal": refusal,
    }


def flag_routes(routes: Mapping[str, Any] | None, config: ServingConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """{"1": {q_len: route}, "0": {q_len: route}} for the probed SGLang (decode_routes) and the serving
    config. An SGLang not found or not readable is taken as current upstream (#37438 and #37601)."""
    routes = routes or {}
    flag0_route = routes.get("flag0_route")
    mtp_gluon = routes.get("mtp_through_gluon")
    assumed = "" if flag0_route in (PERSISTENT, ABORTS, NO_GLUON) else " (SGLang unknown: taken as current upstream)"
    out: dict[str, dict[str, dict[str, Any]]] = {"1": {}, "0": {}}
    for q_len in config.q_lens:
        key = str(q_len)
        if config.dcp_size > 1 and config.dcp_decode_backend == "asm" and q_len == 1:
            dcp = _route(
                "mla_decode_fwd",
                True,
                f"DCP {config.dcp_size} with the asm decode backend (PR #40750, open as read): "
                f"persistent mla_decode_fwd with fast-mode work metadata, q quantized to fp8 over the "
                f"{12 * config.dcp_size} gathered heads, return_lse; the self-test runs the bf16-q 16-head "
                f"persistent call in its place{assumed}",
                q_len,
            )
            out["1"][key] = out["0"][key] = dcp
            continue
        if flag0_route == NO_GLUON:
            same = _route(
                "mla_decode_fwd", config.persist, f"SGLang before PR #{GLUON_PR}: the flag has no effect", q_len
            )
            out["1"][key] = out["0"][key] = same
            continue
        if q_len == 1 or mtp_gluon or mtp_gluon is None:
            out["1"][key] = _route(
                "mla_gluon",
                False,
                f"Gluon selected{'' if q_len == 1 else f'; q_len {q_len} through mla_gluon (PR #{MTP_PR})'}{assumed}",
                q_len,
            )
        else:
            out["1"][key] = _route(
                "mla_decode_fwd",
                False,
                f"Gluon selected turns persistent off; without PR #{MTP_PR} "
                f"q_len {q_len} runs the non-persistent mla_decode_fwd",
                q_len,
            )
        if config.dcp_size > 1:
            out["0"][key] = _route(
                "mla_gluon",
                False,
                f"DCP {config.dcp_size}: decode always uses Gluon (PR #34432)",
                q_len,
                refusal=DCP_REFUSAL,
            )
        elif flag0_route == ABORTS:
            out["0"][key] = _route("mla_decode_fwd", False, flag0_failure(routes) or "", q_len)
        else:
            persist = config.persist
            out["0"][key] = _route(
                "mla_decode_fwd",
                persist,
                ("persistent" if persist else "SGLANG_AITER_MLA_PERSIST=0: non-persistent")
                + f" (PR #{FIX_PR}){assumed}",
                q_len,
            )
    return out


def no_route(routes_by_q_len: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why a flag cannot serve: one line per q_len whose route is known to abort or be refused."""
    return [
        f"q_len {q}: {r['aborts']}"
        for q, r in sorted(routes_by_q_len.items(), key=lambda kv: int(kv[0]))
        if r.get("aborts")
    ]
