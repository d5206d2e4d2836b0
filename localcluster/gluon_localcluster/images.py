"""Container images built here, never pulled: buildah (no daemon) into a storage of the harness's own under
.cluster/buildah, each saved as a docker-archive under .cluster/images, named by a hash of its inputs so that
a warm run reuses it and a changed input rebuilds it. The node's runtime imports the archives
(`ctr images import`).

The archives are the cache, not buildah's storage: an image built FROM another names its base's archive
(`docker-archive:PATH`), and the storage is emptied after each build, so the disk holds one build's layers at a
time beside the archives (a CI machine ran out of disk when the storage kept every image's layers)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .binaries import ROOT, bin_dir

NODE_DIR = ROOT / "localcluster" / "node"
PAUSE_IMAGE = "localhost/gluon-pause:local"
BASE_IMAGE = "localhost/gluon-debian-python:bookworm"
DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pip", "passwd", "ca-certificates")
SERVING_IMAGE = "localhost/gluon-serving-simulation:local"  # SIMULATION (see serving_image)
OPERATOR_IMAGE = "localhost/gluon-rollout-operator:local"
AGENT_IMAGE = "localhost/gluon-rollout-agent:local"
AGENT_SIMULATION_IMAGE = "localhost/gluon-rollout-agent-simulation:local"  # SIMULATION (agent_simulation_image)
AGENT_SIMULATION_ARGS = (  # the chart's agent.extraArgs that make that image's self-test outcome its node.json
    "--source=gluon_localcluster.fakes.simulated:SimulatedSource",
    "--source-arg=/opt/simulation/agent/node.json",
)


def images_dir() -> Path:
    return bin_dir().parent / "images"


def _buildah(*args: str, timeout: float = 1800) -> str:
    store = bin_dir().parent / "buildah"
    argv = ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


@dataclass(frozen=True)
class Built:
    name: str
    archive: Path
    seconds: float  # 0.0 when the cached archive was reused
    bytes: int

    @property
    def reference(self) -> str:
        """What a FROM line names to build on this image: its archive, whatever buildah's storage holds."""
        return f"docker-archive:{self.archive}"


# A build needs its scratch context, its base and its own layers in the storage, and its archive: the serving
# image (Triton's shared library alone is several hundred MB) peaks at about 2.6 GiB (measured 2026-12-02).
MIN_FREE_BYTES = 4 * 2**30


def require_free_disk(where: Path, need: int = MIN_FREE_BYTES) -> None:
    """Fail before a build with what is missing, rather than midway with buildah's `no space left on device`."""
    free = shutil.disk_usage(where).free
    if free < need:
        raise RuntimeError(
            f"building images needs {need / 2**30:.1f} GiB free on the filesystem of {where}; it has "
            f"{free / 2**30:.1f} GiB: free some space (old archives under {images_dir()} may go) and run again"
        )


def empty_storage() -> None:
    """Remove every image and working container from the harness's buildah storage (the archives stay)."""
    _buildah("rm", "--all")
    _buildah("rmi", "--all", "--force")


def _digest(paths: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(paths):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_key(
    name: str,
    inputs: list[Path],
    build_args: dict[str, str],
    target: str | None,
    key_extra: str,
    base: tuple[str, Built] | None,
) -> str:
    """The hash an image's archive is named by: its inputs, arguments, and its base's archive by name only
    (the same image in two checkouts has the same key)."""
    based_on = [base[0], base[1].archive.name] if base else None
    return _digest(inputs, json.dumps([name, build_args, target, key_extra, based_on], sort_keys=True))


def archive_for(name: str, key: str) -> Path:
    return images_dir() / f"{name.replace('/', '_').replace(':', '_')}-{key}.tar"


def build(
    name: str,
    containerfile: Path,
    inputs: list[Path],
    build_args: dict[str, str],
    prepare: Callable[[Path], None] | None = None,
    context: Path | None = None,
    target: str | None = None,
    key_extra: str = "",
    base: tuple[str, Built] | None = None,
) -> Built:
    """`buildah bud` of `containerfile`, cached under the hash of `inputs` and `build_args`. The build context
    is `context`, or a scratch folder that `prepare` fills (called only when the image must be built). `base`:
    the build argument its FROM reads and the image it names, rebuilt when that image is (its archive's name
    is in the key; its path, which differs between checkouts, is not)."""
    key = cache_key(name, [containerfile, *inputs], build_args, target, key_extra, base)
    if base is not None:
        build_args = {**build_args, base[0]: base[1].reference}
    archive = archive_for(name, key)
    if archive.is_file():
        return Built(name, archive, 0.0, archive.stat().st_size)
    archive.parent.mkdir(parents=True, exist_ok=True)
    require_free_disk(archive.parent)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gluon-image-", dir=images_dir()) as scratch:
        if prepare is not None:
            prepare(Path(scratch))
        args = [f"--build-arg={k}={v}" for k, v in build_args.items()] + ([f"--target={target}"] if target else [])
        args += _host_trust()
        _buildah(
            "bud",
            "-q",
            "--layers=false",
            "--network=host",
            "-f",
            str(containerfile),
            *args,
            "-t",
            name,
            str(context or scratch),
        )
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    try:
        _buildah("push", "-q", name, f"docker-archive:{partial}:{name}")
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
        empty_storage()
    for stale in archive.parent.glob(archive.name.rsplit("-", 1)[0] + "-*.tar"):
        if stale != archive:
            stale.unlink()
    return Built(name, archive, time.monotonic() - start, archive.stat().st_size)


def _host_trust() -> list[str]:
    """This host's CA bundle over the image's during RUN steps only (a TLS-inspecting proxy may stand between
    this machine and PyPI); the image keeps its own."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    return [f"--volume={bundle}:{bundle}:ro"] if bundle.is_file() else []


def _run(argv: list[str], what: str, timeout: float = 1800) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}):\n{result.stdout[-1000:]}{result.stderr[-3000:]}")


def pause_image() -> Built:
    """The sandbox image: pause.c, compiled statically with Debian's gcc, FROM scratch."""
    source = NODE_DIR / "pause" / "pause.c"

    def compile_pause(context: Path) -> None:
        _run(["gcc", "-static", "-Os", "-s", "-o", str(context / "pause"), str(source)], f"compiling {source}")

    return build(PAUSE_IMAGE, NODE_DIR / "pause" / "Containerfile", [source], {}, prepare=compile_pause)


def base_image() -> Built:
    """Debian bookworm's python3 and pip (mmdebstrap from Debian's packages), standing in for the Dockerfile's
    `python:3.12-slim`: a Python image has no PEP 668 marker, so neither has this one."""
    recipe = {"suite": DEBIAN_SUITE, "variant": "minbase", "include": ",".join(BASE_PACKAGES)}

    def bootstrap(context: Path) -> None:
        _run(
            [
                "mmdebstrap",
                "--quiet",
                f"--variant={recipe['variant']}",
                f"--include={recipe['include']}",
                '--aptopt=Acquire::Retries "3"',
                '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
                '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
                DEBIAN_SUITE,
                str(context / "rootfs.tar"),
            ],
            "mmdebstrap (Debian's packages)",
        )

    return build(BASE_IMAGE, NODE_DIR / "base" / "Containerfile", [], recipe, prepare=bootstrap)


def _tree(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
    )


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)


HARNESS = ROOT / "localcluster" / "gluon_localcluster"
# The harness's SimulatedSource (stdlib and the agent's portable modules), for images that simulate a self-test.
SIMULATED_SOURCE_MODULES = (
    HARNESS / "__init__.py",
    HARNESS / "fakes" / "__init__.py",
    HARNESS / "fakes" / "simulated.py",
)
SIMULATION_NODE_FILE = NODE_DIR / "agent-simulation" / "node.json"
# The self-test pods' extra arguments (chart selfTest.extraArgs) that make their outcome the serving SIMULATION
# image's node file: the probe is the real one, of that image; only the kernels are SIMULATION.
SELFTEST_SIMULATION_ARGS = (
    "--source=gluon_localcluster.fakes.simulated:SimulatedSource",
    "--source-arg=/opt/simulation/agent/node.json",
)
SERVING_IMAGE_NEXT = "localhost/gluon-serving-simulation:next"  # SIMULATION: the same with another aiter version
NEXT_AITER_VERSION = "0.2.0+fake"


def copy_simulated_source(context: Path) -> None:
    for module in SIMULATED_SOURCE_MODULES:
        target = context / "harness" / module.relative_to(HARNESS.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(module, target)
    shutil.copy(SIMULATION_NODE_FILE, context / "node.json")


def serving_image(name: str = SERVING_IMAGE, aiter_version: str | None = None) -> Built:
    """SIMULATION of the serving image (localcluster/node/serving): the fake aiter, the gfx950 torch stand-in,
    the real Triton of this environment (its CUDA backend left out: a ROCm image has none), the fake SGLang
    exporter, serve.py, which reports the flag its process sees, and the harness's SimulatedSource with its node
    file, for self-test pods (SELFTEST_SIMULATION_ARGS). `aiter_version`: the fake aiter's version string
    replaced, for a second image of another digest (a serving upgrade)."""
    from .fakes.stacks import AITER_STACK, TORCH_GFX950_ON_DEVICES, triton_site, write_tree

    triton = Path(triton_site()) / "triton"
    serving = NODE_DIR / "serving"
    exporter = HARNESS / "fake_sglang.py"
    torch_text = json.dumps(TORCH_GFX950_ON_DEVICES, sort_keys=True)
    triton_version = (triton / "__init__.py").read_text()

    def assemble(context: Path) -> None:
        _copy_tree(AITER_STACK, context / "aiter")
        if aiter_version is not None:
            init = context / "aiter" / "aiter" / "__init__.py"
            text = init.read_text()
            init.write_text(re.sub(r'__version__ = "[^"]*"', f'__version__ = "{aiter_version}"', text, count=1))
        write_tree(context / "torch-gfx950", TORCH_GFX950_ON_DEVICES)
        _copy_tree(triton, context / "triton" / "triton")
        shutil.rmtree(context / "triton" / "triton" / "backends" / "nvidia", ignore_errors=True)
        (context / "sglang").mkdir()
        shutil.copy(exporter, context / "sglang" / "fake_sglang.py")
        shutil.copy(serving / "serve.py", context / "serve.py")
        copy_simulated_source(context)

    inputs = [serving / "serve.py", exporter, *_tree(AITER_STACK), *SIMULATED_SOURCE_MODULES, SIMULATION_NODE_FILE]
    return build(
        name,
        serving / "Containerfile",
        inputs,
        {},
        prepare=assemble,
        key_extra="triton without backends/nvidia" + torch_text + triton_version + (aiter_version or ""),
        base=("PYTHON_IMAGE", base_image()),
    )


def serving_image_next() -> Built:
    """SIMULATION: the serving image rebuilt with another aiter stand-in version, so another digest."""
    return serving_image(SERVING_IMAGE_NEXT, NEXT_AITER_VERSION)


def dockerfile_inputs(dockerfile: Path = ROOT / "Dockerfile") -> list[Path]:
    """What the Dockerfile's COPY lines take from the repository (read from it, so a new COPY counts)."""
    paths: list[Path] = [dockerfile]
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            for source in words[1:-1]:
                path = ROOT / source
                paths.extend(_tree(path) if path.is_dir() else [path] if path.is_file() else [])
    return paths


def operator_image() -> Built:
    """The project's Dockerfile, target `operator`, FROM the Debian python image (PYTHON_IMAGE)."""
    return dockerfile_target(OPERATOR_IMAGE, "operator", "PYTHON_IMAGE", base_image())


def agent_image() -> Built:
    """The project's Dockerfile, target `agent`, FROM the simulated serving image (BASE_IMAGE)."""
    return dockerfile_target(AGENT_IMAGE, "agent", "BASE_IMAGE", serving_image())


def agent_simulation_image() -> Built:
    """SIMULATION for real nodes without an AMD GPU: the agent image plus the harness's SimulatedSource and a
    node file (localcluster/node/agent-simulation) under which the probe is the agent's own and each GPU it
    finds passes the self-test. The chart selects it with agent.extraArgs = AGENT_SIMULATION_ARGS."""
    recipe = NODE_DIR / "agent-simulation"
    return build(
        AGENT_SIMULATION_IMAGE,
        recipe / "Containerfile",
        [SIMULATION_NODE_FILE, *SIMULATED_SOURCE_MODULES],
        {},
        prepare=copy_simulated_source,
        base=("AGENT_IMAGE", agent_image()),
    )


def dockerfile_target(name: str, target: str, base_arg: str, base: Built) -> Built:
    """One target of the project's Dockerfile, its base passed through `base_arg`, rebuilt when the base is."""
    return build(
        name,
        ROOT / "Dockerfile",
        dockerfile_inputs(),
        {},
        context=ROOT,
        target=target,
        base=(base_arg, base),
    )


def require_tools() -> None:
    missing = [tool for tool in ("buildah", "gcc") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"building images needs {', '.join(missing)}: run .ci/install-tools")


ALL = (pause_image, base_image, serving_image, operator_image, agent_image, agent_simulation_image)


def main() -> None:
    """`python -m gluon_localcluster.images`: every image built (or its cached archive reused), one line each."""
    require_tools()
    for make in ALL:
        image = make()
        state = f"built in {image.seconds:.0f} s" if image.seconds else "cached"
        print(f"{image.name}: {image.bytes / 2**20:.0f} MiB, {state} ({image.archive.name})", flush=True)


if __name__ == "__main__":
    main()
