"""A stand-in for ROCm aiter (no AMD GPU exists here), built to aiter's documented signatures.

Kernels record every call's arguments in CALLS and compute through gluon_agent's fp32 reference, so
tests can prove that our adapters call aiter exactly as SGLang does. Behaviour switches through
FAKE_AITER_MODE (see _fake.py) makes chosen devices abort, hang or return garbage.
"""

__version__ = "0.1.99+fake"

from . import mla  # noqa: E402,F401
