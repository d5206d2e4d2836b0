"""`kubectl gluon`: the kubectl plugin (console script `kubectl-gluon`, entry point cli.main). views and
controls are pure; cli is the shell that talks to the API server with the user's kubeconfig. Importing
this package imports nothing else."""
