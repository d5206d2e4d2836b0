"""Proofs in the serving image: which self-test pods to start, what a finished one proved, and which to delete.

A node's verdict belongs to the software that will run the kernel: the serving image by the digest its pods
resolved to, with the rollout's serving configuration. A self-test pod runs the probe and the self-test in that
very image, pinned to one node (gluon_agent.selftest_pod); its termination message is read into an ImageProof
on the node (contract.ANNOTATION_PROOFS). Pure: the world is plain data in, a ProvingPlan out; the executor
creates and deletes the pods and patches the nodes.

Upstream patterns followed: the AMD GPU operator's test runner (one test per node, results kept on the node as
Events and labels, finished Jobs cleaned up) and NVIDIA's operator-validator (a pod pinned to each node, stale
ones deleted by label and node). Unlike both, tests run in bounded waves (`max_parallel` fleet-wide, one per node
at a time) and a pod that cannot be scheduled, cannot pull, is OOM-killed or hangs ends as an `error` proof with
its reason: the node stays at 0 and says why, and is tried again after `retry_seconds`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from pydantic import StrictStr

from gluon_common import contract, image_ref
from gluon_common.report import ImageProof, Lenient, NodeProofs, PodProof

from . import records

PROOFS_KEPT = 8  # per node: the images of a rolling upgrade and a few configurations, never unbounded
RESULTS = ("pass", "fail", "error")
START_FAILURES = (  # a container waiting for one of these will not start by itself soon
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
)


@dataclass(frozen=True)
class Stack:
    """What a self-test proves: a serving image by digest (and the reference that runs exactly it) with a
    serving configuration (its digest, and its JSON form the pod is given)."""

    digest: str
    pinned: str
    serving: str
    serving_json: str = "{}"


@dataclass(frozen=True)
class Demand:
    """A node that should hold a proof of `stack`; `waiting`: serving pods there run it already."""

    node: str
    stack: Stack
    waiting: bool = False
    request: str | None = None  # the node's selftest-request annotation: a new value asks again


@dataclass(frozen=True)
class ProvingPod:
    """A self-test pod as the caches saw it (world readings fill it from the Pod)."""

    name: str
    node: str
    digest: str
    serving: str
    created: float
    phase: str = "Pending"
    deleting: bool = False
    unschedulable: str | None = None  # the PodScheduled=False message, while it is so
    waiting: tuple[str, str] | None = None  # (reason, message) of a container that waits to start
    install_failed: str | None = None  # the install init container ended non-zero: why
    terminated: tuple[int, str, str] | None = None  # the self-test container's (exit code, reason, message)
    failed: str | None = None  # phase Failed without a container verdict: the pod's reason and message
    request: str | None = None  # the node's request value it was started for
    image: str = ""


@dataclass(frozen=True)
class Limits:
    # self-test pods at once, fleet-wide: a count, or a percentage of the nodes asked for (rounded up, at least 1),
    # so a fleet of any size is proved in about the same number of waves
    max_parallel: int | str = "10%"
    schedule_seconds: float = 600.0  # unschedulable for this long: an error proof
    start_seconds: float = 600.0  # waiting to start (pull, config) for this long: an error proof
    run_seconds: float = 1800.0  # no verdict this long after creation: hung
    retry_seconds: float = 900.0  # an error proof is tried again after this long
    period_seconds: float = 7 * 86_400.0  # any proof is renewed after this long (drivers, firmware)


@dataclass(frozen=True)
class ProvingPlan:
    create: list[Demand] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # pod names: read, or stale
    record: dict[str, list[ImageProof]] = field(default_factory=dict)  # node -> new proofs, to merge
    waiting: int = 0  # demands left for later waves
    read: dict[str, str] = field(default_factory=dict)  # pod name -> its node, for the pods whose proofs are recorded


PERCENT = re.compile(r"(100|[1-9][0-9]?)%")


def parallel_cap(value: int | str, nodes: int) -> int:
    """A count as it is; a percentage of `nodes`, rounded up, at least 1 (as the rollout's maxParallel)."""
    if isinstance(value, int):
        return value
    return max(1, math.ceil(int(value[:-1]) * nodes / 100))


def keep_pods_of(planned: ProvingPlan, node: str) -> ProvingPlan:
    """The plan without deleting the pods whose proofs on `node` could not be written: read again next time."""
    kept = {name for name, where in planned.read.items() if where == node}
    return replace(planned, delete=[name for name in planned.delete if name not in kept])


# ---------------------------------------------------------------- one pod's outcome


def first_sentence(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def message_proof(message: str) -> tuple[PodProof | None, str | None]:
    """The pod's proof, or why its message is none: a plain sentence (a shell that found no python3) is the
    reason itself; JSON of the wrong shape names the field."""
    if not message.lstrip().startswith("{"):
        return None, f"it said: {first_sentence(message, 200)}"
    proof, problem = records.read_json(PodProof, message, "its message")
    return proof, (problem.replace("its message field", "its message is not a proof:") if problem else None)


def proof_reason(proof: PodProof) -> str:
    """Why the pod's verdict is what it is, in one line: its problems, else the first failing paths."""
    test = proof.selftest
    if test.problems:
        return first_sentence("; ".join(test.problems))
    failing = [
        f"GPU {gpu.index} {path} {result}" + (f" ({gpu.reasons[path][0]})" if gpu.reasons.get(path) else "")
        for gpu in test.gpus
        for path, result in gpu.result.items()
        if result != "pass"
    ]
    if failing:
        return first_sentence("; ".join(failing[:3]))
    if not proof.probe.capable:
        return first_sentence("not capable: " + "; ".join(proof.probe.missing_for_capable or ["(no reason given)"]))
    return f"both paths pass on {len(test.gpus)} GPU(s)"


def terminated_proof(pod: ProvingPod, code: int, reason: str, message: str, now: float) -> ImageProof:
    if reason == "OOMKilled":
        return error_proof(pod, now, "the self-test pod was OOM-killed (raise selfTest.resources' memory limit)")
    proof, problem = message_proof(message) if message else (None, "it wrote no message")
    if proof is None:
        return error_proof(
            pod, now, f"the self-test pod ended with exit code {code} ({reason or 'no reason'}): {problem}"
        )
    result = proof.selftest.result if proof.selftest.result in RESULTS else "error"
    if result == "pass" and not proof.probe.capable:
        result = "fail"  # a kernel that runs in an image SGLang cannot take the path in proves nothing
    return ImageProof(
        digest=pod.digest,
        serving=pod.serving,
        image=pod.image or None,
        result=result,
        reason=proof_reason(proof),
        at=now,
        fingerprint=proof.selftest.fingerprint,
        capable=proof.probe.capable,
        sglang=proof.probe.sglang,
        seconds=proof.selftest.seconds,
        request=pod.request,
    )


def error_proof(pod: ProvingPod, now: float, reason: str) -> ImageProof:
    return ImageProof(
        digest=pod.digest,
        serving=pod.serving,
        image=pod.image or None,
        result="error",
        reason=first_sentence(reason),
        at=now,
        request=pod.request,
    )


def outcome(pod: ProvingPod, now: float, limits: Limits) -> ImageProof | None:
    """What the pod proved, or None while it is still on its way."""
    age = now - pod.created
    if pod.terminated is not None:
        return terminated_proof(pod, *pod.terminated, now)
    if pod.install_failed is not None:
        return error_proof(pod, now, f"the install step in the agent image failed: {pod.install_failed}")
    if pod.failed is not None:
        return error_proof(pod, now, f"the self-test pod failed before a verdict: {pod.failed}")
    if pod.unschedulable is not None and age >= limits.schedule_seconds:
        return error_proof(
            pod,
            now,
            f"the self-test pod could not be scheduled within {limits.schedule_seconds:g} s: {pod.unschedulable}",
        )
    if pod.waiting is not None and pod.waiting[0] in START_FAILURES and age >= limits.start_seconds:
        reason, message = pod.waiting
        return error_proof(
            pod, now, f"the self-test pod could not start within {limits.start_seconds:g} s: {reason}: {message}"
        )
    if age >= limits.run_seconds:
        return error_proof(pod, now, f"no verdict within {limits.run_seconds:g} s of its creation: the self-test hung")
    return None


# ---------------------------------------------------------------- what each node needs


def read_proofs(raw: str | None) -> tuple[NodeProofs, str | None]:
    """A node's proofs annotation; an unreadable one counts as none, with why (it is then rewritten whole)."""
    proofs, problem = records.read_json(NodeProofs, raw, contract.ANNOTATION_PROOFS)
    return proofs or NodeProofs(), (f"{problem}: tested again" if problem else None)


def needs_test(demand: Demand, proofs: NodeProofs, now: float, limits: Limits) -> bool:
    proof = proofs.find(demand.stack.digest, demand.stack.serving)
    if proof is None or proof.at is None:
        return True
    if demand.request is not None and proof.request != demand.request:
        return True  # a person or the operator asked again
    if proof.result == "error" and now - proof.at >= limits.retry_seconds:
        return True
    return now - proof.at >= limits.period_seconds


def merged(proofs: NodeProofs, new: Sequence[ImageProof], kept: int = PROOFS_KEPT) -> NodeProofs:
    """New proofs first, replacing older ones of the same (digest, serving), the newest `kept` in all."""
    keys = {(p.digest, p.serving) for p in new}
    rest = [p for p in proofs.proofs if (p.digest, p.serving) not in keys]
    return NodeProofs(proofs=[*new, *rest][:kept])


def pod_name(node: str, stack: Stack) -> str:
    """One name per (node, image, configuration): a create that raced another gets 409, never a twin."""
    key = hashlib.sha256(f"{node}\n{stack.digest}\n{stack.serving}".encode()).hexdigest()[:20]
    return f"gluon-selftest-{key}"


# ---------------------------------------------------------------- the plan


def plan(
    demands: Iterable[Demand],
    pods: Iterable[ProvingPod],
    proofs: Mapping[str, NodeProofs],
    now: float,
    limits: Limits = Limits(),
    prune: bool = True,
) -> ProvingPlan:
    """Read what finished, delete what was read or is no longer wanted, and start the next wave: at most
    `limits.max_parallel` pods at once and one per node, nodes whose serving pods already run the image first.
    `prune` False: `demands` may not be every rollout's yet (a restarted operator), so a running pod no demand
    names is left to finish, never deleted as stale."""
    demands = list(demands)
    cap = parallel_cap(limits.max_parallel, len({d.node for d in demands}))
    wanted = {(d.node, d.stack.digest, d.stack.serving) for d in demands}
    record: dict[str, list[ImageProof]] = {}
    delete: list[str] = []
    read: dict[str, str] = {}
    busy: set[str] = set()
    running: set[tuple[str, str, str]] = set()
    active = 0
    for pod in sorted(pods, key=lambda p: p.name):
        key = (pod.node, pod.digest, pod.serving)
        if pod.deleting:
            active += 1  # its GPUs are not free until it is gone
            busy.add(pod.node)
            continue
        proof = outcome(pod, now, limits)
        if proof is not None:
            record.setdefault(pod.node, []).append(proof)
            read[pod.name] = pod.node
            delete.append(pod.name)
        elif key not in wanted and prune:
            delete.append(pod.name)  # its image or configuration is no longer served there
        else:  # running, wanted or not known to be unwanted yet
            active += 1
            busy.add(pod.node)
            running.add(key)
    current = {node: merged(proofs.get(node, NodeProofs()), new) for node, new in record.items()}
    due = [
        d
        for d in demands
        if (d.node, d.stack.digest, d.stack.serving) not in running
        and needs_test(d, current.get(d.node, proofs.get(d.node, NodeProofs())), now, limits)
    ]
    due.sort(key=lambda d: (not d.waiting, d.node, d.stack.digest, d.stack.serving))
    create: list[Demand] = []
    for demand in due:
        if active >= cap:
            break
        if demand.node in busy:
            continue
        create.append(demand)
        busy.add(demand.node)
        active += 1
    return ProvingPlan(create, delete, record, len(due) - len(create), read)


# ---------------------------------------------------------------- the pod, to create and as read back

INSTALL_CONTAINER = "gluon-install"
SELFTEST_CONTAINER = "gluon-selftest"
VOLUME = "gluon-selftest"
MOUNT = "/gluon"
LABEL_VALUE_MAX = 63


class PodStack(Lenient):
    """contract.ANNOTATION_SELFTEST_POD_STACK: what the operator created the pod to prove."""

    node: StrictStr
    digest: StrictStr
    serving: StrictStr
    image: str | None = None
    request: str | None = None


@dataclass(frozen=True)
class PodSettings:
    """What the chart decides for every self-test pod (operator env, from values selfTest.*): the namespace, the
    agent image whose install step brings the self-test in, and the policy part of the pod: GPU access (volumes,
    mounts, securityContext, or a device plugin's resources), tolerations, priority class, pull secrets."""

    namespace: str
    agent_image: str
    pull_policy: str = "IfNotPresent"
    pod: Mapping[str, Any] = field(default_factory=dict)  # pod spec fields merged in as given
    container: Mapping[str, Any] = field(default_factory=dict)  # the self-test container's fields, likewise
    deadline_seconds: int = 1200  # the self-test's own deadline; the pod's activeDeadlineSeconds adds a margin
    extra_args: tuple[str, ...] = ()  # the chart's selfTest.extraArgs, after ours (a later option wins)


def node_label(node: str) -> str:
    """The node as a label value: itself when it fits 63 characters, else a hash of it (names reach 253)."""
    if len(node) <= LABEL_VALUE_MAX:
        return node
    return "h-" + hashlib.sha256(node.encode()).hexdigest()[:32]


def run_command(deadline: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The self-test container's command, in the serving image: our copy first on PYTHONPATH, python3 or python;
    `extra_args` reach the module as they are (the shell's own arguments: never parsed by it)."""
    return [
        "/bin/sh",
        "-c",
        f"PYTHONPATH={MOUNT}/lib${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH; py=$(command -v python3 || "
        f'command -v python) || {{ echo "the serving image has no python3 on PATH" > /dev/termination-log; exit 2; }}; '
        f'exec "$py" -m {contract.SELFTEST_POD_MODULE} --serving-config "$GLUON_SERVING_CONFIG" '
        f'--deadline {deadline} "$@"',
        "selftest",
        *extra_args,
    ]


def selftest_pod(demand: Demand, settings: PodSettings) -> dict[str, Any]:
    """The Pod proving `demand.stack` on `demand.node`: pinned there by node affinity (the scheduler still
    weighs its requests and priority, so serving is never pushed out), the serving image by digest, never
    restarted, ended by the kubelet past its deadline."""
    stack = demand.stack
    annotation = {
        "node": demand.node,
        "digest": stack.digest,
        "image": stack.pinned,
        "serving": stack.serving,
        "request": demand.request,
    }
    container: dict[str, Any] = {
        "name": SELFTEST_CONTAINER,
        "image": stack.pinned,
        # a bare image ID exists only where it was seen: never pulled (a kubelet would ask Docker Hub for
        # docker.io/library/sha256 by that tag, content unchecked)
        "imagePullPolicy": "Never" if image_ref.node_local(stack.pinned) else settings.pull_policy,
        "command": run_command(settings.deadline_seconds, settings.extra_args),
        "terminationMessagePolicy": "File",
        **settings.container,
    }
    container["env"] = [
        *list(settings.container.get("env") or []),
        {"name": "GLUON_SERVING_CONFIG", "value": stack.serving_json},
    ]
    container["volumeMounts"] = [
        *list(settings.container.get("volumeMounts") or []),
        {"name": VOLUME, "mountPath": MOUNT, "readOnly": True},
    ]
    spec: dict[str, Any] = {
        **settings.pod,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": settings.deadline_seconds + 120,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [demand.node]}]}
                    ]
                }
            }
        },
        "initContainers": [
            {
                "name": INSTALL_CONTAINER,
                "image": settings.agent_image,
                "imagePullPolicy": settings.pull_policy,
                "command": ["gluon-agent", "selftest-pod", "--install", MOUNT],
                "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
            }
        ],
        "containers": [container],
        "volumes": [*list(settings.pod.get("volumes") or []), {"name": VOLUME, "emptyDir": {}}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(demand.node, stack),
            "namespace": settings.namespace,
            "labels": {contract.LABEL_SELFTEST_POD: "true", contract.LABEL_SELFTEST_POD_NODE: node_label(demand.node)},
            "annotations": {contract.ANNOTATION_SELFTEST_POD_STACK: json.dumps(annotation, sort_keys=True)},
        },
        "spec": spec,
    }


def condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def container_status(status: Mapping[str, Any], key: str, name: str) -> Mapping[str, Any]:
    for c in status.get(key) or []:
        if isinstance(c, Mapping) and c.get("name") == name:
            return c
    return {}


def state_of(container: Mapping[str, Any], which: str) -> Mapping[str, Any] | None:
    state = container.get("state")
    value = state.get(which) if isinstance(state, Mapping) else None
    return value if isinstance(value, Mapping) else None


def proving_pod_view(obj: Mapping[str, Any], created: float) -> ProvingPod | None:
    """A self-test pod as the plan reads it, from the Pod; None for one without the operator's annotation
    (not ours to read: it is deleted as stale by the caller)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    stack, _ = records.read_json(
        PodStack, (meta.get("annotations") or {}).get(contract.ANNOTATION_SELFTEST_POD_STACK), "the pod's stack"
    )
    if stack is None:
        return None
    node, digest, serving = stack.node, stack.digest, stack.serving
    scheduled = condition(status, "PodScheduled")
    unschedulable = (
        str(scheduled.get("message") or scheduled.get("reason") or "unschedulable")
        if scheduled is not None and scheduled.get("status") == "False"
        else None
    )
    install = container_status(status, "initContainerStatuses", INSTALL_CONTAINER)
    ended = state_of(install, "terminated")
    install_failed = None
    if ended is not None and ended.get("exitCode") not in (0, None):
        why = str(ended.get("reason") or "no reason") + (f": {ended['message']}" if ended.get("message") else "")
        install_failed = f"exit code {ended.get('exitCode')} ({why})"
    main = container_status(status, "containerStatuses", SELFTEST_CONTAINER)
    done = state_of(main, "terminated")
    waiting = next(
        (
            (str(w.get("reason") or ""), str(w.get("message") or ""))
            for w in (state_of(install, "waiting"), state_of(main, "waiting"))
            if w is not None
        ),
        None,
    )
    phase = str(status.get("phase") or "Pending")
    failed = (
        f"{status.get('reason') or 'Failed'}: {status.get('message') or 'no message'}"
        if phase == "Failed" and done is None and install_failed is None
        else None
    )
    return ProvingPod(
        name=str(meta.get("name") or ""),
        node=node,
        digest=digest,
        serving=serving,
        created=created,
        phase=phase,
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=unschedulable,
        waiting=waiting,
        install_failed=install_failed,
        terminated=(int(done.get("exitCode") or 0), str(done.get("reason") or ""), str(done.get("message") or ""))
        if done is not None
        else None,
        failed=failed,
        request=stack.request,
        image=stack.image or "",
    )


# ---------------------------------------------------------------- what a rollout asks to be proved

MAX_IMAGES = 3  # per rollout: the images of a rolling upgrade (old, new, and one more), not every leftover


@dataclass(frozen=True)
class ServedImage:
    """A serving pod's image as its node's runtime resolved it (gluon_common.image_ref)."""

    node: str
    digest: str
    pinned: str | None  # None: no reference runs exactly it (the pod's reason says why)
    created: float


def demands(
    nodes: Iterable[str],
    served: Iterable[ServedImage],
    serving_digest: str,
    serving_json: str,
    requests: Mapping[str, str | None] | None = None,
    max_images: int = MAX_IMAGES,
) -> list[Demand]:
    """Every node of the rollout × the newest `max_images` images its serving pods run anywhere (so a node is
    proved before a rolling upgrade's pods reach it), a node-local image only where it is. Each node runs an
    image by the reference its own pods resolved, else by the newest seen elsewhere."""
    served = [s for s in served if s.pinned]
    newest: dict[str, float] = {}
    for s in served:
        newest[s.digest] = max(newest.get(s.digest, 0.0), s.created)
    digests = sorted(newest, key=lambda d: (-newest[d], d))[:max_images]
    local = {(s.node, s.digest): s.pinned for s in served}
    anywhere = {
        s.digest: s.pinned
        for s in sorted(served, key=lambda s: s.created)
        if s.pinned is not None and not image_ref.node_local(s.pinned)
    }
    out = []
    for node in sorted(set(nodes)):
        for digest in digests:
            pinned = local.get((node, digest)) or anywhere.get(digest)
            if pinned is None:
                continue
            stack = Stack(digest, pinned, serving_digest, serving_json)
            out.append(Demand(node, stack, waiting=(node, digest) in local, request=(requests or {}).get(node)))
    return out


# ---------------------------------------------------------------- the chart's settings

SETTINGS_ENV = "GLUON_SELFTEST_POD"  # JSON the chart renders from values selfTest.* (off when unset or empty)
PERCENT_TOO = {"maxParallel": " or a percentage such as '10%'"}
LIMIT_KEYS = {
    "maxParallel": "max_parallel",
    "scheduleSeconds": "schedule_seconds",
    "startSeconds": "start_seconds",
    "runSeconds": "run_seconds",
    "retrySeconds": "retry_seconds",
    "periodSeconds": "period_seconds",
}


def settings_from_env(environ: Mapping[str, str]) -> tuple[PodSettings, Limits] | None:
    """The self-test pods' settings, None when they are off; a ValueError naming the key otherwise (the start
    stops with it: a chart that renders nonsense must be fixed, not ignored)."""
    raw = environ.get(SETTINGS_ENV, "").strip()
    if not raw:
        return None
    try:
        data = records.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{SETTINGS_ENV} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{SETTINGS_ENV} must be a JSON object")
    for key in ("namespace", "agentImage"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ValueError(f"{SETTINGS_ENV}.{key} must be a non-empty string")
    limits = {}
    for key, attribute in LIMIT_KEYS.items():
        if key not in data:
            continue
        value = data[key]
        if attribute == "max_parallel" and isinstance(value, str) and PERCENT.fullmatch(value):
            limits[attribute] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{SETTINGS_ENV}.{key} must be a positive number{PERCENT_TOO.get(key, '')}, not {value!r}")
        else:
            limits[attribute] = int(value) if attribute == "max_parallel" else float(value)
    for key in ("pod", "container"):
        if not isinstance(data.get(key, {}), dict):
            raise ValueError(f"{SETTINGS_ENV}.{key} must be an object")
    extra = data.get("extraArgs", [])
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise ValueError(f"{SETTINGS_ENV}.extraArgs must be a list of strings")
    deadline = data.get("deadlineSeconds", PodSettings.deadline_seconds)
    if isinstance(deadline, bool) or not isinstance(deadline, int) or deadline <= 0:
        raise ValueError(f"{SETTINGS_ENV}.deadlineSeconds must be a positive whole number, not {deadline!r}")
    settings = PodSettings(
        namespace=data["namespace"],
        agent_image=data["agentImage"],
        pull_policy=str(data.get("pullPolicy") or "IfNotPresent"),
        pod=data.get("pod", {}),
        container=data.get("container", {}),
        deadline_seconds=deadline,
        extra_args=tuple(extra),
    )
    return settings, Limits(**limits)
