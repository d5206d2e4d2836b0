"""On-GPU self-test of the accelerated MLA decode path and of the path we roll back to.

Everything here that imports torch or triton runs only in self-test child processes
(`worker.py`), never in the agent daemon.
"""
