"""gluon-rollout node agent: capability probe, GPU self-test, node labels and metrics."""

__version__ = "0.1.0"
