"""The Dockerfile and the distribution agree: copied paths exist, entrypoints are our console scripts, and
the wheel and each image hold the product only (the harness, localcluster/, ships in neither)."""

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
    for needed in ("agent", "common", "operator", "pyproject.toml", "README.md"):
        assert needed not in ignored


# ---------------------------------------------------------------- what the wheel and each image hold

PRODUCT = {"gluon_operator", "gluon_agent", "gluon_common"}


def stage_copies(stage: str) -> list[str]:
    """The source folders a Dockerfile stage copies (beside pyproject.toml and README.md)."""
    copied = [line.split()[1:-1] for line in dockerfile_stages()[stage] if line.startswith("COPY ")]
    return sorted(s for sources in copied for s in sources if s not in ("pyproject.toml", "README.md"))


def built_wheel(tmp_path: Path, folders: list[str]) -> list[str]:
    """The file list of the wheel pip builds from pyproject.toml, README.md and `folders` of this checkout,
    offline (no build isolation, no index), in a copy so the checkout gets no build/ or egg-info."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in folders:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist", "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (source / "dist").glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def top_level(names: list[str]) -> set[str]:
    return {name.split("/")[0] for name in names}


def test_the_wheel_holds_the_product_and_not_the_harness(tmp_path):
    """Built from the whole checkout (the harness's folder included), the wheel holds the operator, the
    agent and their shared ground, and nothing of localcluster/, tests or benches."""
    names = built_wheel(tmp_path, ["agent", "common", "localcluster", "operator", "bench", "tests"])
    packages = {top for top in top_level(names) if not top.endswith(".dist-info")}
    assert packages == PRODUCT
    assert [top for top in top_level(names) if top.endswith(".dist-info")] == ["gluon_rollout-0.1.0.dist-info"]
    assert "gluon_common/contract.py" in names and "gluon_common/report.py" in names
    assert not [n for n in names if "localcluster" in n or "fake" in n.lower()]


def test_each_image_installs_its_own_side_and_the_shared_ground(tmp_path):
    """The operator image carries no agent code; the agent image no operator code; both the shared ground."""
    expected = {"operator": {"gluon_operator", "gluon_common"}, "agent": {"gluon_agent", "gluon_common"}}
    for stage, packages in expected.items():
        assert stage_copies(stage) == sorted(p.removeprefix("gluon_") for p in packages), stage
        names = built_wheel(tmp_path / stage, stage_copies(stage))
        assert {top for top in top_level(names) if not top.endswith(".dist-info")} == packages, stage
