"""A stand-in for ROCm aiter (no AMD GPU exists here), built to aiter's code at e4048607.

Kernels record every call's arguments in CALLS and compute through gluon_agent's fp32 reference, so
tests can prove that our adapters call aiter exactly as SGLang does; they refuse what aiter's kernel
table and checks refuse (see mla.py, _table.py). Behaviour switches through FAKE_AITER_MODE (see
_fake.py) make chosen devices abort, hang or return garbage.
"""

__version__ = "0.1.99+fake"

from . import mla  # noqa: F401
from .ops.attention import get_mla_metadata_info_v1, get_mla_metadata_v1  # noqa: F401
