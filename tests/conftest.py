import os
import sys
from pathlib import Path

import pytest

# Triton decides at decoration time whether a kernel is interpreted; no GPU exists where the suite runs,
# so every in-process kernel runs under the interpreter (TRITON_INTERPRET=1), set before any import.
os.environ["TRITON_INTERPRET"] = "1"
# The operator reads its reconcile interval when its handlers are imported: fast, for tests.
os.environ.setdefault("GLUON_RECONCILE_SECONDS", "0.3")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fakes


@pytest.fixture
def clean_env():
    """Our environment without anything that would change what a probed interpreter imports."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_AITER_MLA_GLUON")}
    return env
