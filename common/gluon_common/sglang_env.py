"""How SGLang reads a boolean environment variable, in one place (sglang python/sglang/srt/environ.py,
`EnvField.get` and `EnvBool.parse`, checked at 0003215c):

- unset: the field's default (SGLANG_AITER_MLA_GLUON's is True: on);
- set: lower-cased, NOT stripped, then "true", "1", "yes", "y" are True and "false", "0", "no", "n" False;
- anything else, the empty string and " 0" included, warns and gives the default.

So an empty value (what a kubelet that ignores `fileKeyRef` hands the process) runs the accelerated path.

Stdlib only: the preflight copies this package into foreign serving images.
"""

from __future__ import annotations

from typing import Final

TRUE_WORDS: Final = ("true", "1", "yes", "y")
FALSE_WORDS: Final = ("false", "0", "no", "n")
FLAG_DEFAULT: Final = True  # EnvBool(True): SGLANG_AITER_MLA_GLUON's default since SGLang PR #34647


def parsed(raw: str) -> bool | None:
    """True or False for a value SGLang reads as a boolean, None for one it warns about (and defaults)."""
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def env_bool(raw: str | None, default: bool) -> bool:
    """What SGLang makes of `raw` (None: the variable is unset) for a field with this default."""
    if raw is None:
        return default
    value = parsed(raw)
    return default if value is None else value


def flag_runs(raw: str | None) -> str:
    """'1' or '0': the path an SGLang process whose SGLANG_AITER_MLA_GLUON is `raw` runs."""
    return "1" if env_bool(raw, FLAG_DEFAULT) else "0"
