"""gluon-rollout's shared ground, imported by both the operator and the agent: the contract (every label,
annotation and metric name), the Kubernetes client helpers, the retry back-off, the serving-route facts,
and the schema of the agent's node report.

Nothing is imported here: the preflight copies `contract` and `sglang_routes` (stdlib only, python3 >= 3.8)
into foreign serving images, where pydantic and the Kubernetes client may be missing."""
