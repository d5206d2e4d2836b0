"""Fake software stacks put on a probed interpreter's PYTHONPATH (no AMD GPU or aiter exists here)."""

from __future__ import annotations

import textwrap
from pathlib import Path

FAKES = Path(__file__).parent
AITER_STACK = FAKES / "aiter_stack"

AITER_FAILURES = {
    "importerror": "raise ImportError('libmla_gluon.so: cannot open shared object file')",
    "runtimeerror": "raise RuntimeError('aiter gluon kernels require triton>=3.6')",
    "abort": "import os\nos.abort()",
    "hang": "import time\ntime.sleep(3600)",
}

TRITON_36 = {
    "triton/__init__.py": "__version__ = '3.6.0'\n",
    "triton/experimental/__init__.py": "",
    "triton/experimental/gluon/__init__.py": "",
    # 3.6.0 has cga_layout on Swizzled and Blocked, not on Padded: the probe must look at Padded.
    "triton/experimental/gluon/language/__init__.py": textwrap.dedent(
        """
        class PaddedSharedLayout:
            def __init__(self, interval_padding_pairs, order, shape):
                pass

        class SwizzledSharedLayout:
            def __init__(self, vec, per_phase, max_phase, order, cga_layout=None):
                pass
        """
    ),
}

# A ROCm torch on a gfx950 node, as far as the probe looks at it.
TORCH_GFX950 = {
    "torch/__init__.py": textwrap.dedent(
        """
        __version__ = '2.9.0+rocm7.0'
        bfloat16 = 'bfloat16'
        float8_e4m3fn = 'float8_e4m3fn'

        class version:
            hip = '7.0.51831'
            cuda = None

        class _Props:
            name = 'AMD Instinct MI355X'
            gcnArchName = 'gfx950:sramecc+:xnack-'
            total_memory = 288 * 2**30
            major, minor = 9, 5

        class cuda:
            @staticmethod
            def is_available():
                return True

            @staticmethod
            def device_count():
                return 2

            @staticmethod
            def get_device_properties(index):
                return _Props()

        class _Tensor:
            def __init__(self, values):
                self.values = list(values)

            def to(self, dtype):
                return self

        def tensor(values, dtype=None, device=None):
            return _Tensor(values)

        def equal(a, b):
            return a.values == b.values
        """
    ),
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def failing_aiter(root: Path, kind: str) -> Path:
    """An aiter whose Gluon module fails on import in the given way."""
    body = AITER_FAILURES[kind]
    return write_tree(
        root,
        {
            "aiter/__init__.py": "",
            "aiter/ops/__init__.py": "",
            "aiter/ops/triton/__init__.py": "",
            "aiter/ops/triton/gluon/__init__.py": "",
            "aiter/ops/triton/gluon/mla_gluon.py": body + "\n",
        },
    )
