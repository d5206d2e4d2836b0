"""Fake software stacks put on a probed interpreter's PYTHONPATH (no AMD GPU or aiter exists here)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

FAKES = Path(__file__).parent
AITER_STACK = FAKES / "aiter_stack"
# this checkout's gluon_agent and gluon_common, ahead of any installed copy, and the harness (fake devices)
CHECKOUT_SOURCES = tuple(FAKES.parents[2] / part for part in ("agent", "common", "localcluster"))


def fresh_fake_aiter(monkeypatch) -> list:
    """The fake aiter importable in this process, freshly imported, its call record empty."""
    import sys

    monkeypatch.syspath_prepend(str(AITER_STACK))
    for name in [m for m in sys.modules if m == "aiter" or m.startswith("aiter.")]:
        monkeypatch.delitem(sys.modules, name)
    import aiter._fake

    aiter._fake.CALLS.clear()
    aiter._fake.RECORDING = True
    return aiter._fake.CALLS


def child_env(env: dict[str, str], *paths: Path) -> dict[str, str]:
    """`env` for a child that imports gluon_agent (self-test workers): `paths`, then this checkout's packages."""
    return dict(env, PYTHONPATH=os.pathsep.join(str(p) for p in (*paths, *CHECKOUT_SOURCES)))


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


def _on_device_files(torch_init: str) -> str:
    """The stand-in's GPUs as ROCm's runtime finds them: none unless /dev/kfd opens for reading and writing
    (a container's device cgroup may refuse it), then one per /dev/dri/renderD* node."""
    visible = textwrap.dedent(
        """
        def _visible():
            import glob, os
            try:
                os.close(os.open('/dev/kfd', os.O_RDWR))
            except OSError:
                return 0
            return len(glob.glob('/dev/dri/renderD*'))
        """
    )
    swapped = torch_init.replace("return True", "return _visible() > 0", 1).replace("return 2", "return _visible()", 1)
    assert swapped.count("_visible()") == 2, "TORCH_GFX950's cuda class changed: update _on_device_files"
    return visible + swapped


# SIMULATION: the serving image's torch stand-in, GPUs from the node's device files (realnode.RealNode(gpus=N)).
TORCH_GFX950_ON_DEVICES = {"torch/__init__.py": _on_device_files(TORCH_GFX950["torch/__init__.py"])}


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


# SIMULATION of SGLang installs in a serving image, as far as the probe reads them: the package metadata
# and the text of the two attention files whose code decides the decode routes. The snippets are the
# lines the probe looks for (sgl-project/sglang aiter_backend.py at 003c5589, aiter_mla_gluon.py at
# 2ee4570a); everything else of SGLang is absent.
SGLANG_INIT_PS_OFF_ALWAYS = """
            if self.head_pad_mode == "zero" and self.kv_cache_dtype == fp8_dtype:
                _use_mla_ps_kernel = False
                fast_mode = False
                intra_batch_mode = False
                log_mla_gluon_capability(logger)
"""
SGLANG_INIT_PS_OFF_FOR_GLUON = """
            if self.head_pad_mode == "zero" and self.kv_cache_dtype == fp8_dtype:
                if prefer_mla_gluon_decode(
                    head_pad_mode=self.head_pad_mode,
                    num_head=self.num_head,
                    kv_cache_dtype=self.kv_cache_dtype,
                ):
                    _use_mla_ps_kernel = False
"""
SGLANG_GLUON_DECODE = {
    False: (
        "def mla_gluon_decode(\n    *,\n    q,\n    k_buffer,\n    min_kv_seq_len: int,\n    kv_scale: float = 1.0,\n"
        ") -> Optional[torch.Tensor]:\n    pass\n"
    ),
    True: (
        "def mla_gluon_decode(\n    *,\n    q,\n    k_buffer,\n    min_kv_seq_len: int,\n    kv_scale: float = 1.0,\n"
        "    qlen: int = 1,\n) -> Optional[torch.Tensor]:\n    pass\n"
    ),
}


def sglang_image(root: Path, version: str, gluon: bool = True, flag0_guard: bool = True, mtp: bool = False) -> Path:
    """A SIMULATION of an SGLang install: `version` in its metadata; the Gluon module (PR #34647) or not,
    PR #37438's guard or not, PR #37601's qlen or not."""
    attention = "sglang/srt/layers/attention/"
    files = {
        "sglang/__init__.py": "raise RuntimeError('SIMULATION: the probe must not import sglang')\n",
        f"sglang-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n",
        attention + "aiter_backend.py": "# SIMULATION\n"
        + (SGLANG_INIT_PS_OFF_FOR_GLUON if flag0_guard else SGLANG_INIT_PS_OFF_ALWAYS),
    }
    if gluon:
        files[attention + "aiter_mla_gluon.py"] = "# SIMULATION\n" + SGLANG_GLUON_DECODE[mtp]
    return write_tree(root, files)


def triton_site() -> str:
    """The serving image's Triton: the real PyPI one (Gluon with cga_layout), from our environment."""
    import triton

    return os.path.dirname(os.path.dirname(triton.__file__))
