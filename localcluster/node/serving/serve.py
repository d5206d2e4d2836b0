"""SIMULATION: the serving container's process in the simulated serving image. Its first log line is the
SGLANG_AITER_MLA_GLUON value this process sees (from the kubelet: env, fileKeyRef, or the shell wrapper the
webhook puts in front of the command); then it waits until stopped, as a server would."""

import os
import signal
import sys
import time

flag = os.environ.get("SGLANG_AITER_MLA_GLUON")
print(f"SGLANG_AITER_MLA_GLUON={'<unset>' if flag is None else flag}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(3600)
