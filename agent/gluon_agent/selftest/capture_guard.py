"""What our adapters do inside a graph capture, checked op by op.

SGLang holds every buffer its decode graph reads (the layer's scales, the work metadata sized for the
graph's batch) before capture and fills the metadata outside the graph before each replay. A
host-to-device copy inside capture is refused by CUDA and HIP graphs alike ("Cannot copy between CPU
and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned"; pinned, it would replay
stale values), and a tensor our code allocates there would be a buffer the engine never refills. The
guard is a TorchDispatchMode around the capture: it records every op with a host tensor input, and
every op called from our code (not from inside aiter, whose Python wrappers allocate their own split
buffers, as upstream's do) whose output is fresh storage rather than a view or an in-place write.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

TORCH_DIR = os.path.dirname(torch.__file__)
MAX_RECORDED = 20


def _tensors(values: Any) -> list[torch.Tensor]:
    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor)]


def caller() -> str:
    """file:line of the innermost frame outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(TORCH_DIR) and name != __file__:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


KERNEL_WRAPPERS = (os.path.join(os.path.dirname(__file__), "triton_mla.py"),)  # our portable kernel's own wrapper


def inside_kernel(where: str) -> bool:
    """aiter's code (its wrappers allocate their split buffers, as upstream's do) or our portable kernel's."""
    return f"{os.sep}aiter{os.sep}" in where or where.startswith(KERNEL_WRAPPERS)


class CaptureGuard(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Not torch._disable_dynamo around __torch_dispatch__ (torch's default for a mode): its first call
        imports torch._dynamo, 4-5 s on the H200 machines, and nothing here is compiled."""
        return False

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    def record(self, text: str) -> None:
        if len(self.violations) < MAX_RECORDED and text not in self.violations:
            self.violations.append(text)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        host = [t for t in inputs if t.device.type == "cpu" and t.dim() > 0]
        to_device = any(t.device.type != "cpu" for t in inputs) or "cuda" in str(kwargs.get("device", ""))
        if host and to_device:  # recorded first: CUDA itself refuses most of these
            self.record(f"host-to-device {func} at {caller()}")
        result = func(*args, **kwargs)
        storages = {t.untyped_storage().data_ptr() for t in inputs}
        if any(t.untyped_storage().data_ptr() not in storages for t in _tensors(result)):
            where = caller()
            if not inside_kernel(where):
                self.record(f"allocation {func} at {where}")
        return result
