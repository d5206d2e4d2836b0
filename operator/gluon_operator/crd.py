"""The GluonRollout CRD, generated from the pydantic spec model: structural OpenAPI v3 with enums,
minimums, defaults and required fields. `gluon-operator crd` prints it; the chart ships the same file
(a test proves they agree)."""

from __future__ import annotations

from typing import Any

from .spec import GROUP, KIND, PLURAL, VERSION, GluonRolloutSpec

DROP = ("title", "$defs")


def _inline(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Resolve $refs, turn Optional (anyOf X|null) into nullable X, drop what OpenAPI v3 structural
    schemas do not allow."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline({**target, **merged}, defs)
    if schema.get("x-kubernetes-int-or-string"):
        return {k: v for k, v in schema.items() if k not in DROP and not (k == "default" and v is None)}
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(schema["anyOf"])
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        out = _inline({**options[0], **rest}, defs) if len(options) == 1 else _inline(rest, defs)
        if nullable:
            out["nullable"] = True
        return out
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in DROP:
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas cannot say it; the API server prunes unknown fields instead
        if key == "default" and value is None:
            continue
        if key in ("exclusiveMaximum", "exclusiveMinimum") and not isinstance(value, bool):
            # JSON Schema 2020 (pydantic) says `exclusiveMaximum: 1`; OpenAPI v3.0 says `maximum: 1` plus `true`
            out[key.replace("exclusive", "").lower()] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _inline(sub, defs) for name, sub in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = _inline(value, defs)
        else:
            out[key] = value
    if "properties" in out:
        out.setdefault("type", "object")
        required = set(out.get("required", []))
        for name, sub in out["properties"].items():
            if sub.get("type") == "object" and "properties" in sub and name not in required and not sub.get("nullable"):
                sub["default"] = {}  # so the API server creates it and fills in its fields' defaults
    return out


def spec_schema() -> dict[str, Any]:
    raw = GluonRolloutSpec.model_json_schema()
    return _inline(raw, raw.get("$defs", {}))


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Promoted", "type": "integer", "jsonPath": ".status.counts.Promoted"},
    {"name": "Analyzing", "type": "integer", "jsonPath": ".status.counts.Analyzing"},
    {"name": "RolledBack", "type": "integer", "jsonPath": ".status.counts.RolledBack"},
    {"name": "Ineligible", "type": "integer", "jsonPath": ".status.counts.Ineligible"},
    {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"},
    # why it is where it is (gating.rollout_message): an invalid spec's problem, an abort, a gate waiting
    {"name": "Message", "type": "string", "jsonPath": ".status.message"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": "gluonrollout",
                "kind": KIND,
                "shortNames": ["gr"],
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                # Written only by the operator; free-form so status can grow without migrations.
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    import yaml

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    header = "# Generated by `gluon-operator crd` from operator/gluon_operator/spec.py. Do not edit.\n"
    return header + yaml.dump(crd(), Dumper=NoAliases, sort_keys=False)
