"""The serving configuration a rollout's pods run (gluon_common.sglang_routes.ServingConfig), read from
their serving container's command, args and env, with `spec.serving` for what the pods do not say. Pure.

Upstream facts (sgl-project/sglang, read 2026-12-02):
- `--speculative-algorithm` turns speculative decoding on; target verify runs q_len =
  `--speculative-num-draft-tokens` per request. With `--speculative-eagle-topk 1` SGLang adjusts the draft
  tokens to `--speculative-num-steps` + 1 (server_args.py: "speculative_num_draft_tokens is adjusted to
  speculative_num_steps + 1"). Without steps, topk and draft tokens it picks them per model
  (`auto_choose_speculative_params`), which a pod spec does not show.
- DSPARK takes its verify window from `--speculative-dspark-block-size` (gamma) + 1, unless
  `--speculative-num-draft-tokens` is given; without either, gamma comes from the draft checkpoint, and
  Kimi-K3's DSpark draft uses block 7 (SGLang's own Kimi-K3 override assumes q_len 8 then; PR #37601
  launches with `--speculative-dspark-block-size 7`).
- DCP: `--dcp-size N` (PR #34432's launch command); `SGLANG_AITER_MLA_DCP_DECODE_BACKEND=gluon|asm`
  (PR #40750, default gluon); `SGLANG_AITER_MLA_PERSIST` (a bool env, default on); `--page-size N`
  (default 1); `--enable-dp-attention` (store_true).
- SGLang's bool env values: true/1/yes/y and false/0/no/n, any case, never stripped (gluon_common.sglang_env).

Args may be separate tokens, `--flag=value`, or inside `sh -c "..."` (split as the shell would, shlex).
Kubernetes expands `$(VAR)` in command and args from the container's env; so does this reader, for env
with a literal value. A value it cannot read (a shell variable, an env from a ConfigMap) is unknown: the
spec must say it, or the rollout says the configuration is unresolved; it never guesses.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from gluon_common import contract, sglang_env
from gluon_common.sglang_routes import MAX_VERIFY_Q_LEN, ServingConfig, flag_routes, no_route

ALGORITHM, DRAFT_TOKENS, STEPS, TOPK = (
    "--speculative-algorithm",
    "--speculative-num-draft-tokens",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
)
DSPARK_BLOCK = "--speculative-dspark-block-size"
DCP_SIZE, PAGE_SIZE, DP_ATTENTION = "--dcp-size", "--page-size", "--enable-dp-attention"
ENV_PERSIST, ENV_DCP_BACKEND = "SGLANG_AITER_MLA_PERSIST", "SGLANG_AITER_MLA_DCP_DECODE_BACKEND"
KIMI_K3_DSPARK_BLOCK = 7  # the block size of Kimi-K3's DSpark draft checkpoint
SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh", "busybox"})
K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
FIELDS = tuple(ServingConfig().as_dict())


class Unknown(str):
    """A field the pod sets in a way this reader cannot resolve; the text says how."""


@dataclass(frozen=True)
class PodServing:
    """What one pod's serving container states: ServingConfig fields (JSON names) with a value or Unknown."""

    stated: Mapping[str, Any] = field(default_factory=dict)
    # Its literal SGLANG_AITER_MLA_GLUON (True, False, Unknown, or None when unset). An uninjected pod whose
    # template says False runs the fallback for sure; True or unset leave it to SGLang's own probe.
    flag_env: bool | Unknown | None = None


# ---------------------------------------------------------------- reading one container


def expand(token: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command and args ($$ escapes; an unknown name stays as written)."""
    return K8S_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), token.replace("$$(", "\0")).replace("\0", "$(")


def tokens_of(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args, with each shell's `-c` script split as the shell would."""
    raw = [expand(str(t), env) for t in [*(container.get("command") or []), *(container.get("args") or [])]]
    out: list[str] = []
    shell = False
    for i, token in enumerate(raw):
        out.append(token)
        shell = shell or os.path.basename(token) in SHELLS
        if shell and i + 1 < len(raw) and re.fullmatch(r"-[a-z]*c", token):
            try:
                out.extend(shlex.split(raw[i + 1], comments=True))
            except ValueError:  # an unbalanced quote: the shell would refuse it too
                pass
    return out


def flag_values(tokens: Sequence[str]) -> dict[str, str | bool]:
    """--flag value, --flag=value, or a bare --flag (True); the last one wins, as argparse does."""
    out: dict[str, str | bool] = {}
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        name, eq, value = token.partition("=")
        if eq:
            out[name] = value
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            out[name] = tokens[i + 1]
        else:
            out[name] = True
    return out


def literal_env(container: Mapping[str, Any]) -> tuple[dict[str, str], set[str]]:
    """(name -> literal value, names whose value comes from elsewhere: valueFrom)."""
    values, elsewhere = {}, set()
    for item in container.get("env") or []:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            continue
        if "value" in item or "valueFrom" not in item:
            values[item["name"]] = str(item.get("value") or "")
        else:
            elsewhere.add(item["name"])
    return values, elsewhere


def integer(flags: Mapping[str, str | bool], name: str) -> int | Unknown | None:
    if name not in flags:
        return None
    value = flags[name]
    if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
        return int(value)
    return Unknown(
        f"{name} {value if isinstance(value, str) else '(no value)'!r} is not a number this reader can resolve"
    )


def verify_q_lens(flags: Mapping[str, str | bool]) -> list[int] | Unknown | None:
    """Target verify's q_len from the speculative flags: None without speculative decoding."""
    algorithm = flags.get(ALGORITHM)
    if algorithm is None:
        return None
    if not isinstance(algorithm, str):
        return Unknown(f"{ALGORITHM} has no value")
    draft, steps, topk, block = (integer(flags, f) for f in (DRAFT_TOKENS, STEPS, TOPK, DSPARK_BLOCK))
    for value in (draft, steps, topk, block):
        if isinstance(value, Unknown):
            return value
    if algorithm.upper() == "DSPARK":
        q_len = draft or (block + 1 if block is not None else KIMI_K3_DSPARK_BLOCK + 1)
    elif topk == 1 and steps:
        q_len = steps + 1
    elif draft:
        q_len = draft
    else:
        return Unknown(
            f"{ALGORITHM} {algorithm} without {DRAFT_TOKENS} (or {TOPK} 1 with {STEPS}): SGLang picks the "
            "draft tokens per model, which the pod spec does not show"
        )
    if q_len > MAX_VERIFY_Q_LEN:
        return Unknown(f"a verify q_len of {q_len} is beyond the {MAX_VERIFY_Q_LEN} the self-test covers")
    return [q_len] if q_len >= 2 else []


def env_bool(name: str, values: Mapping[str, str], elsewhere: set[str]) -> bool | Unknown | None:
    if name in elsewhere:
        return Unknown(f"env {name} comes from a reference (valueFrom)")
    if name not in values:
        return None
    value = sglang_env.parsed(values[name])
    if value is not None:
        return value
    return Unknown(f"env {name}={values[name]!r} is not a boolean SGLang reads (it warns and takes its default)")


def container_serving(container: Mapping[str, Any]) -> PodServing:
    """What the serving container states (see the module's docstring)."""
    values, elsewhere = literal_env(container)
    flags = flag_values(tokens_of(container, values))
    stated: dict[str, Any] = {}
    for key, value in (
        ("verifyQLens", verify_q_lens(flags)),
        ("dcpSize", integer(flags, DCP_SIZE)),
        ("pageSize", integer(flags, PAGE_SIZE)),
        ("persist", env_bool(ENV_PERSIST, values, elsewhere)),
    ):
        if value is not None:
            stated[key] = value
    if DP_ATTENTION in flags:
        stated["dpAttention"] = True
    if ENV_DCP_BACKEND in elsewhere:
        stated["dcpDecodeBackend"] = Unknown(f"env {ENV_DCP_BACKEND} comes from a reference (valueFrom)")
    elif ENV_DCP_BACKEND in values:
        stated["dcpDecodeBackend"] = values[ENV_DCP_BACKEND].strip().lower()
    return PodServing(stated, env_bool(contract.FLAG_ENV, values, elsewhere))


# ---------------------------------------------------------------- the rollout's configuration


@dataclass(frozen=True)
class Resolution:
    """The rollout's serving configuration, or why there is none (pods disagree, a value is unreadable)."""

    config: ServingConfig | None
    problem: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)  # field -> "pods" | "spec" | "default"
    pods: int = 0

    def status(self) -> dict[str, Any]:
        """status.serving."""
        return {
            "config": self.config.as_dict() if self.config else None,
            "digest": self.config.digest if self.config else None,
            "sources": dict(self.sources),
            "pods": self.pods,
            "problem": self.problem,
        }


def pod_config(
    stated: Mapping[str, Any], override: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(the config's JSON form, where each field came from, what stays unknown): the pod first, then the spec."""
    out, sources, unknown = {}, {}, []
    for name in FIELDS:
        value = stated.get(name)
        if value is not None and not isinstance(value, Unknown):
            out[name], sources[name] = value, "pods"
        elif override.get(name) is not None:
            out[name], sources[name] = override[name], "spec"
        elif isinstance(value, Unknown):
            unknown.append(f"{value}; set spec.serving.{name}")
        else:
            sources[name] = "default"
    return out, sources, unknown


def resolve_serving(pods: Iterable[tuple[str, PodServing]], override: Mapping[str, Any] | None) -> Resolution:
    """One configuration for the rollout from its pods (name, what it states) and spec.serving. Pods that
    resolve to different configurations, or a value neither a pod nor the spec resolves: no config, and why."""
    override = {k: v for k, v in (override or {}).items() if v is not None}
    listed = sorted(pods, key=lambda p: p[0]) or [("", PodServing())]
    count = sum(1 for name, _ in listed if name)
    groups: dict[
        str, tuple[str, PodServing, list[str]]
    ] = {}  # a fleet's pods state a few setups: each is resolved once
    for name, pod in listed:
        groups.setdefault(repr(sorted(pod.stated.items())), (name, pod, []))[2].append(name)
    by_digest: dict[str, tuple[ServingConfig, list[str]]] = {}
    sources: dict[str, str] = {}
    for first, pod, names in groups.values():
        data, sources_here, unknown = pod_config(pod.stated, override)
        where = f"pod {first}" if first else "spec.serving"
        if unknown:
            return Resolution(None, f"{where}: " + "; ".join(unknown), sources_here, count)
        try:
            config = ServingConfig.from_dict(data, where)
        except ValueError as exc:
            return Resolution(None, str(exc), sources_here, count)
        by_digest.setdefault(config.digest, (config, []))[1].extend(names)
        sources = {k: ("pods" if v == "pods" or sources.get(k) == "pods" else v) for k, v in sources_here.items()}
    if len(by_digest) > 1:
        return Resolution(None, disagreement(by_digest), sources, count)
    config = next(iter(by_digest.values()))[0]
    return Resolution(config, None, sources, count)


def disagreement(by_digest: Mapping[str, tuple[ServingConfig, list[str]]]) -> str:
    configs = [c.as_dict() for c, _ in by_digest.values()]
    differ = [f for f in FIELDS if len({str(c[f]) for c in configs}) > 1]
    groups = "; ".join(
        f"{', '.join(names[:3])}{' and more' if len(names) > 3 else ''}: "
        + ", ".join(f"{f}={config.as_dict()[f]}" for f in differ)
        for config, names in by_digest.values()
    )
    return (
        f"the serving pods run {len(by_digest)} different serving configurations ({groups}): no node is enabled "
        "until they agree (a rollout of the serving workload in progress ends this)"
    )


# ---------------------------------------------------------------- what each flag can run


def without_route(sglang: Mapping[str, Any] | None, config: ServingConfig, flag: str) -> list[str]:
    """Why `flag` cannot serve this configuration on an SGLang (the probe's decode_routes; None: current
    upstream): one line per q_len whose route aborts or is refused, with the route's upstream evidence."""
    key = (
        tuple(
            sorted(
                (k, v)
                for k, v in sglang.items()  # a report's values are anyone's: only scalars count
                if k in ROUTE_FACTS and (v is None or isinstance(v, (str, bool, int, float)))
            )
        )
        if sglang
        else None
    )
    return list(_without_route(key, config, flag))


ROUTE_FACTS = ("version", "flag0_route", "mtp_through_gluon", "evidence")  # what flag_routes reads of decode_routes


@functools.lru_cache(maxsize=256)  # every node of a fleet asks with one of a few SGLang builds
def _without_route(sglang: tuple[tuple[str, Any], ...] | None, config: ServingConfig, flag: str) -> tuple[str, ...]:
    routes = flag_routes(dict(sglang) if sglang else None, config)[flag]
    return tuple(f"{line} [{routes[line.split(':')[0].split()[1]]['evidence']}]" for line in no_route(routes))


def flag0_no_route(sglang: Mapping[str, Any] | None, config: ServingConfig) -> list[str]:
    return without_route(sglang, config, "0")


def flag1_no_route(sglang: Mapping[str, Any] | None, config: ServingConfig) -> list[str]:
    return without_route(sglang, config, "1")


def describe(config: ServingConfig) -> str:
    """The configuration in a person's words (status, Events, explain)."""
    parts = [
        f"verify q_len {', '.join(map(str, config.verify_q_lens))}"
        if config.verify_q_lens
        else "no speculative decoding"
    ]
    if config.dcp_size > 1:
        parts.append(f"DCP {config.dcp_size} ({config.dcp_decode_backend} decode backend)")
    if not config.persist:
        parts.append(f"{ENV_PERSIST}=0")
    parts.append(f"page size {config.page_size}")
    if config.dp_attention:
        parts.append("DP attention")
    return ", ".join(parts)
