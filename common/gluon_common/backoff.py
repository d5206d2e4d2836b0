"""The retry back-off both the agent and the operator use after failed API calls. Pure, stdlib only."""

from __future__ import annotations

import random


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential back-off with "equal jitter": d/2 + uniform(0, d/2), d = min(cap, base * 2^attempt).
    Never less than half the step (no hammering), never in lock-step with the rest of the fleet."""
    step = min(cap, base * 2 ** min(max(0, attempt), 64))  # bounded exponent: 2**1024 would overflow a float
    return step / 2 + rng.uniform(0, step / 2)
