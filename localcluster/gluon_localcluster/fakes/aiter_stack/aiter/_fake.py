"""Shared fake-kernel machinery: argument recording, failure modes, the reference computation.

FAKE_AITER_MODE: comma-separated rules `DEVICE:MODE[:KERNEL]`, e.g. "1:abort:mla_gluon,3:garbage".
DEVICE is the self-test's device index (GLUON_SELFTEST_DEVICE_INDEX) or `*`; MODE is ok, garbage,
abort or hang; KERNEL limits the rule to mla_gluon or mla_decode_fwd.
FAKE_AITER_ARCH: the GPU the fake pretends to run on (default gfx950, an MI355X with 256 CUs).
"""

import os
import signal
import time

CALLS = []
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


def attend(kernel, q, kv_tokens, kv_scale, kv_indptr, kv_indices, sm_scale, out, q_len=1, garbage=False):
    """out[row] = softmax(q[row] @ K^T * sm_scale) @ V over the tokens of kv_indices[kv_indptr[b]:kv_indptr[b+1]]
    that query row b*q_len+i sees (causal within the q block)."""
    from gluon_agent.selftest.reference import mla_decode_reference

    mode = mode_for(kernel)
    if mode == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    if mode == "hang":
        time.sleep(3600)
    ref = mla_decode_reference(q, kv_tokens, kv_scale, kv_indptr, kv_indices, sm_scale, q_len)
    if mode == "garbage" or garbage:
        ref = ref.normal_() * 1e3
    out.copy_(ref.to(out.dtype).view(out.shape))
