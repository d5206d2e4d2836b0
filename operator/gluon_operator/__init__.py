"""gluon-rollout operator: gates nodes, delivers the flag, rolls out node by node, rolls back on regressions."""

__version__ = "0.1.0"
