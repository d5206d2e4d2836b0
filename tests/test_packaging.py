"""The Dockerfile and the distribution agree: copied paths exist, entrypoints are our console scripts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dockerfile_stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        match = re.match(r"FROM \S+ AS (\w+)", line)
        if match:
            current = match.group(1)
            stages[current] = []
        elif current:
            stages[current].append(line)
    return stages


def test_both_targets_exist():
    assert set(dockerfile_stages()) == {"operator", "agent"}
    assert "ARG BASE_IMAGE" in (ROOT / "Dockerfile").read_text()


def test_every_copied_path_exists():
    for stage, lines in dockerfile_stages().items():
        for line in lines:
            if line.startswith("COPY "):
                sources = line.split()[1:-1]
                for source in sources:
                    assert (ROOT / source).exists(), f"{stage}: COPY {source} does not exist"


def test_entrypoints_are_console_scripts():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    expected = {"operator": "gluon-operator", "agent": "gluon-agent"}
    for stage, lines in dockerfile_stages().items():
        entry = [ln for ln in lines if ln.startswith("ENTRYPOINT")]
        assert entry == [f'ENTRYPOINT ["{expected[stage]}"]']
        assert expected[stage] in scripts


def test_operator_image_is_non_root():
    lines = dockerfile_stages()["operator"]
    assert any(re.fullmatch(r"USER \d+:\d+", ln) for ln in lines)


def test_dockerignore_keeps_copied_sources():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    for needed in ("agent", "operator", "pyproject.toml", "README.md"):
        assert needed not in ignored
