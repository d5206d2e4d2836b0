"""SIMULATION: the serving container's process in the simulated serving image. Its first log line is the
SGLANG_AITER_MLA_GLUON value this process sees (from the kubelet: env, fileKeyRef, or the shell wrapper the
webhook puts in front of the command); then it waits until stopped, as a server would. With
SIM_METRICS_PORT set it also serves SGLang's metrics there (the harness's SGLang-shaped exporter, decode speed
SIMULATION: SIM_FLAG_EFFECT is the speed with the flag on over the speed with it off, SIM_NODE the node)."""

import os
import signal
import sys
import time

flag = os.environ.get("SGLANG_AITER_MLA_GLUON")
print(f"SGLANG_AITER_MLA_GLUON={'<unset>' if flag is None else flag}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if os.environ.get("SIM_METRICS_PORT"):
    from fake_sglang import FakeSglang, NodeModel

    serving = "1" if (flag or "").strip().lower() in ("1", "true", "yes", "y") else "0"  # SGLang's EnvBool
    model = NodeModel(os.environ["SIM_NODE"], flag_effect=float(os.environ.get("SIM_FLAG_EFFECT", "1")), noise=0.02)
    FakeSglang(model, lambda: serving).start(int(os.environ["SIM_METRICS_PORT"]), "0.0.0.0")
while True:
    time.sleep(3600)
