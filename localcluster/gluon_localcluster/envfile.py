"""The kubelet's reading of an env file for `valueFrom.fileKeyRef` (Kubernetes EnvFiles, KEP-3721), for the
SIMULATION of the kubelet on kwok's nodes (kubelet_sim.py): a port of k8s pkg/kubelet/util/env ParseEnv
(v1.36), so a flag file the real kubelet would refuse or misread is refused or misread here too.

The format, as ParseEnv reads it: `KEY='value'` lines, the value in single quotes taken literally (newlines
included), a `# comment` after the closing quote, blank lines and `#` lines skipped, leading blanks ignored.
Whitespace before '=' or anything but a comment after the closing quote is an error; whitespace right after
'=' makes the value empty (as `KEY= 'v'` does in a shell). A key the file does not hold reads as ''.
"""

from __future__ import annotations

from collections.abc import Iterator

BLANKS = " \t"


def parse_env_file(text: str, key: str) -> str:
    """`key`'s value in the env file `text` ('' when absent); ValueError for a file ParseEnv refuses."""
    lines = _lines(text)
    number = 0
    for line in lines:
        number += 1
        line = line.lstrip(BLANKS)
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if not equals:
            raise _bad(number, "missing '='")
        if not name.rstrip(BLANKS):
            raise _bad(number, "empty variable name")
        if name != name.rstrip(BLANKS):
            raise _bad(number, "whitespace before '=' is not allowed")
        if value != value.lstrip(BLANKS):  # `KEY= 'v'`: an empty assignment, as in a shell
            if name == key:
                return ""
            continue
        if not value.startswith("'"):
            raise _bad(number, "value must be enclosed in single quotes")
        found, number = _quoted(value[1:], lines, number)
        if name == key:
            return found
    return ""


def _bad(number: int, why: str) -> ValueError:
    return ValueError(f"invalid environment variable format at line {number}: {why}")


def _lines(text: str) -> Iterator[str]:
    """Lines as Go's bufio.ScanLines yields them: split at \\n, one trailing \\r dropped, no empty last line."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return iter(p[:-1] if p.endswith("\r") else p for p in parts)


def _quoted(rest: str, lines: Iterator[str], number: int) -> tuple[str, int]:
    """A single-quoted value from after its opening quote, over as many lines as it spans; (value, last line)."""
    start, parts = number, []
    while True:
        closing = rest.find("'")
        if closing != -1:
            parts.append(rest[:closing])
            after = rest[closing + 1 :].lstrip(BLANKS)
            if after and not after.startswith("#"):
                raise _bad(number, "unexpected content after closing quote")
            return "".join(parts), number
        parts.append(rest + "\n")
        rest = next(lines, None)  # type: ignore[arg-type]
        if rest is None:
            raise ValueError(f"invalid environment variable format starting at line {start}: unclosed single quote")
        number += 1
