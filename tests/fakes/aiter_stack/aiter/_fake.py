"""Shared fake-kernel machinery: argument recording, failure modes, the reference computation.

FAKE_AITER_MODE: comma-separated rules `DEVICE:MODE[:KERNEL]`, e.g. "1:abort:mla_gluon,3:garbage".
DEVICE is the self-test's device index (GLUON_SELFTEST_DEVICE_INDEX) or `*`; MODE is ok, garbage,
abort or hang; KERNEL limits the rule to mla_gluon or mla_decode_fwd.
"""

import os
import signal
import time

CALLS = []


def mode_for(kernel):
    device = os.environ.get("GLUON_SELFTEST_DEVICE_INDEX", "0")
    for rule in filter(None, os.environ.get("FAKE_AITER_MODE", "").split(",")):
        parts = rule.split(":")
        if parts[0] in (device, "*") and (len(parts) < 3 or parts[2] == kernel):
            return parts[1]
    return "ok"


def attend(kernel, q, kv_tokens, kv_scale, kv_indptr, kv_indices, sm_scale, out):
    """out[b] = softmax(q[b] @ K^T * sm_scale) @ V over the tokens kv_indices[kv_indptr[b]:kv_indptr[b+1]]."""
    from gluon_agent.selftest.reference import mla_decode_reference

    mode = mode_for(kernel)
    if mode == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    if mode == "hang":
        time.sleep(3600)
    ref = mla_decode_reference(q, kv_tokens, kv_scale, kv_indptr, kv_indices, sm_scale)
    if mode == "garbage":
        ref = ref.normal_() * 1e3
    out.copy_(ref.to(out.dtype))
