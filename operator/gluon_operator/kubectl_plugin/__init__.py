"""`kubectl gluon`: the kubectl plugin (console script `kubectl-gluon`). views and controls are pure;
cli is the shell that talks to the API server with the user's kubeconfig."""

from .cli import main

__all__ = ["main"]
