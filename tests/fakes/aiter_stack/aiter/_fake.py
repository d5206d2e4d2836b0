"""Shared fake-kernel machinery: argument recording, failure modes, the reference computation."""

import os
import signal
import time

CALLS = []


def behave():
    mode = os.environ.get("FAKE_AITER_MODE", "ok")
    if mode == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    if mode == "hang":
        time.sleep(3600)
    return mode


def attend(q, kv_tokens, kv_scale, kv_indptr, kv_indices, sm_scale, out):
    """out[b] = softmax(q[b] @ K^T * sm_scale) @ V over the tokens kv_indices[kv_indptr[b]:kv_indptr[b+1]]."""
    from gluon_agent.selftest.reference import mla_decode_reference

    ref = mla_decode_reference(q, kv_tokens, kv_scale, kv_indptr, kv_indices, sm_scale)
    if behave() == "garbage":
        ref = ref.normal_() * 1e3
    out.copy_(ref.to(out.dtype))
