"""Type-checked readings of what the operator parses from Nodes and Pods: the agent's report (its schema,
shared with the agent, is gluon_common.report), the operator's own rollback and node records, the
preflight's verdict. Anyone who can write a node annotation or a pod's termination message can put
anything there; a wrong type must make that one node or pod unreadable (with a reason naming the field),
never fail the reconcile of the fleet.

Unknown fields are ignored (agents of other versions add some); known fields have strict types.

Every JSON the operator reads from agents, pods or the API goes through one reader, `loads`: bounded in
size and nesting depth (a 4 KB report nested 2000 deep raised RecursionError out of json.loads), and it
refuses NaN and Infinity (Python's json reads them as numbers; they then fail at math.ceil or int() on
every reconcile). Records add finite numbers on top (`Number`: a "NaN" string is refused too).
"""

from __future__ import annotations

import json
import math
import threading
from typing import Annotated, Any, Literal, Mapping, TypeVar

from pydantic import BaseModel, Field, StrictBool, StrictStr, ValidationError

from gluon_common import contract
from gluon_common.report import Lenient

# Finite JSON numbers; a string of digits is read as its number, anything else (NaN, "Infinity") is an
# error naming the field.
Number = Annotated[float, Field(allow_inf_nan=False)]

JSON_BYTES_LIMIT = 256 * 1024  # Kubernetes' limit on all of one object's annotations together
JSON_DEPTH_LIMIT = 64  # nesting levels; the deepest record the operator or an agent writes has under 10
PAGE_BYTES_LIMIT = None  # an API list page or watch event: as large as the API server sends (depth still bounded)


class UnreadableJSON(ValueError):
    """JSON the one reader refuses: not JSON, too long, nested too deep, or with a non-finite number."""


NOT_FINITE = "which is not a finite number"


def _constant(name: str) -> Any:
    raise UnreadableJSON(f"it holds {name}, {NOT_FINITE}")


FLOAT_RANGE = 2**1023  # an integer past this overflows on the first arithmetic with a float


def problem_in(value: Any, limit: int) -> str | None:
    """What makes a parsed JSON value unusable: nesting past `limit` levels, or a number that is not
    finite (1e999 parses as inf) or an integer past float's range. Iterative: no recursion to overflow."""
    stack: list[tuple[Any, int]] = [([value], 0)]  # the value as the one child of a level 0
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return f"it is nested deeper than {limit} levels"
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
            elif type(child) is float and not math.isfinite(child):
                return f"it holds {child}, which is not a finite number"
            elif type(child) is int and not -FLOAT_RANGE <= child <= FLOAT_RANGE:
                return "it holds an integer past the range of finite numbers"
    return None


def loads(
    raw: str | bytes,
    max_bytes: int | None = JSON_BYTES_LIMIT,
    max_depth: int = JSON_DEPTH_LIMIT,
    non_finite_as_null: bool = False,
) -> Any:
    """The one JSON reader for what the operator reads from agents, pods or the API. Raises UnreadableJSON
    (a ValueError) saying what is wrong, and nothing else: RecursionError never escapes. `non_finite_as_null`:
    NaN, Infinity and numbers past float's range read as null instead of refusing the whole text."""
    if max_bytes is not None:
        size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise UnreadableJSON(f"it is {size} bytes, more than the {max_bytes} read")
    try:
        value = json.loads(raw, parse_constant=(lambda _: None) if non_finite_as_null else _constant)
        if non_finite_as_null:
            value = finite(value)
    except UnreadableJSON:
        raise
    except RecursionError:
        raise UnreadableJSON(f"it is nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int's digit limit
        raise UnreadableJSON(f"it is not JSON ({exc})") from None
    problem = problem_in(value, max_depth)
    if problem:
        raise UnreadableJSON(problem)
    return value


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN; Kubernetes' decoders refuse
    it): what the operator writes goes through this, so it is finite by construction."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def finite_number(value: Any) -> float | None:
    """A loosely typed record field (a record's `numbers`, the rollout's status) as a finite number, or
    None for anything else: a string, a bool, NaN, Infinity, an integer past float's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def whole_count(value: Any) -> int:
    """A count kept in a record's `numbers` (restartedPods, failStreak): 0 unless a finite number >= 0."""
    number = finite_number(value)
    return int(number) if number is not None and number >= 0 else 0


def dumps(value: Any) -> str:
    """An annotation's JSON as the operator writes it: compact, sorted, finite."""
    return json.dumps(finite(value), sort_keys=True, separators=(",", ":"), allow_nan=False)


class RollbackRecord(Lenient):
    """contract.ANNOTATION_ROLLBACK: why the node was rolled back, for which fingerprint, with the numbers."""

    rollout: StrictStr | None = None
    fingerprint: StrictStr | None = None
    at: Number | None = 0.0  # None: unknown (written non-finite, read leniently: gating.parse_rollback)
    reason: StrictStr = "no reason recorded"
    numbers: dict[StrictStr, Any] = Field(default_factory=dict)


class NodeRecord(Lenient):
    """contract.ANNOTATION_NODE_RECORD: the node's durable rollout state (see plan.py)."""

    rollout: StrictStr
    state: Literal[contract.NODE_STATES]  # type: ignore[valid-type]
    reason: StrictStr = ""
    since: Number = 0.0
    fingerprint: StrictStr | None = None
    changedAt: Number | None = None
    holdout: StrictBool = False
    numbers: dict[StrictStr, Any] = Field(default_factory=dict)


class AgentAnswer(Lenient):
    current: StrictBool | None = None
    enabled: StrictBool | None = None
    # False: the node is enabled but holds no passing proof of this pod's own image (selfTest.inServingImage):
    # the pod waits at 0 for its image's self-test, and is restarted once the proof is there, never rolled back
    proved: StrictBool | None = None
    image: StrictStr | None = None  # the digest the agent found this pod's image resolved to


class PreflightVerdict(Lenient):
    """The preflight's termination message (contract.PREFLIGHT_MODULE)."""

    flag: Literal["0", "1"] | None = None
    reason: StrictStr | None = None
    agent: AgentAnswer | None = None
    final: StrictBool | None = None  # a refusal no restart can change (e.g. the image's python is too old)
    held: StrictBool | None = (
        None  # it holds the pod: the kubelet ignores fileKeyRef (the serving process would get '')
    )
    truncated: StrictBool | None = (
        None  # cut to the kubelet's 4096 bytes: the reason is cut, flag, final and agent kept
    )


Record = TypeVar("Record", bound=BaseModel)


def problem(exc: ValidationError) -> str:
    """The first error, naming its field: 'selftest.gpus.0: Input should be a valid dictionary'."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


class ReadCache:
    """Readings by their exact text. Every reconcile plans over every node, and a node's report and record
    change only when someone writes them: parsing each again (the bounded reader walks every value, then
    pydantic) was most of a 5000-node plan's CPU (bench/scale.py). The models are frozen, so one reading
    serves every reader. Bounded by the bytes of text held: past the budget it starts afresh."""

    BUDGET_BYTES = 64 * 1024 * 1024

    def __init__(self) -> None:
        self.entries: dict[tuple[type, str, str], tuple[Any, str | None]] = {}
        self.held = 0
        self.lock = threading.Lock()

    def get(self, key: tuple[type, str, str]) -> tuple[Any, str | None] | None:
        return self.entries.get(key)

    def put(self, key: tuple[type, str, str], reading: tuple[Any, str | None]) -> None:
        with self.lock:
            if self.held + len(key[1]) > self.BUDGET_BYTES:
                self.entries, self.held = {}, 0
            self.entries[key] = reading
            self.held += len(key[1])

    def clear(self) -> None:
        with self.lock:
            self.entries, self.held = {}, 0


READINGS = ReadCache()


def read_json(
    model: type[Record], raw: str | None, what: str, non_finite_as_null: bool = False
) -> tuple[Record | None, str | None]:
    """(record, None), (None, None) when absent, or (None, why) naming `what` and the field."""
    if raw is None:
        return None, None
    key = (model, raw, what + (" (non-finite as null)" if non_finite_as_null else ""))
    reading = READINGS.get(key)
    if reading is None:
        reading = _read_json(model, raw, what, non_finite_as_null)
        READINGS.put(key, reading)
    return reading


def _read_json(model: type[Record], raw: str, what: str, non_finite_as_null: bool) -> tuple[Record | None, str | None]:
    try:
        value: Any = loads(raw, non_finite_as_null=non_finite_as_null)
    except UnreadableJSON as exc:
        return None, f"{what} is unreadable: {exc}"
    try:
        return model.model_validate(value), None
    except ValidationError as exc:
        return None, f"{what} field {problem(exc)}"
