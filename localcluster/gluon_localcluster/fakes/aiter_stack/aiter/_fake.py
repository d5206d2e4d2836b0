"""Shared fake-kernel machinery: argument recording and failure modes (the arithmetic is _compute.py).

FAKE_AITER_MODE: comma-separated rules `DEVICE:MODE[:KERNEL]`, e.g. "1:abort:mla_gluon,3:garbage".
DEVICE is the self-test's device index (GLUON_SELFTEST_DEVICE_INDEX) or `*`; MODE is ok, garbage,
abort or hang; KERNEL limits the rule to mla_gluon or mla_decode_fwd.
FAKE_AITER_ARCH: the GPU the fake pretends to run on (default gfx950, an MI355X with 256 CUs).
"""

import os
import signal
import time

CALLS = []
RECORDING = False  # tests turn it on (fresh_fake_aiter); a self-test child must not keep every call's tensors alive


def record(entry):
    if RECORDING:
        CALLS.append(entry)
    return entry


CU_COUNT = {"gfx950": 256, "gfx942": 304}  # MI355X, MI300X


def arch():
    return os.environ.get("FAKE_AITER_ARCH", "gfx950")


def cu_num():
    return CU_COUNT.get(arch(), 256)


def mode_for(kernel):
    device = os.environ.get("GLUON_SELFTEST_DEVICE_INDEX", "0")
    for rule in filter(None, os.environ.get("FAKE_AITER_MODE", "").split(",")):
        parts = rule.split(":")
        if parts[0] in (device, "*") and (len(parts) < 3 or parts[2] == kernel):
            return parts[1]
    return "ok"


def apply_mode(kernel, out):
    """This device's failure mode for `kernel`: abort or hang here; True when the answer must be garbage."""
    mode = mode_for(kernel)
    if mode == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    if mode == "hang":
        time.sleep(3600)
    return mode == "garbage"


def spoil(out):
    """What a kernel reading wrong buffers leaves: large finite values in every element."""
    out.normal_().mul_(1e3)
