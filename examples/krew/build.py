"""The krew archive of `kubectl gluon` and its manifest (examples/krew/gluon.yaml), built from this checkout.

    python examples/krew/build.py [--out dist]        # writes dist/kubectl-gluon-v<version>.tar.gz
    python examples/krew/build.py --check             # the manifest's sha256 is this archive's

The archive holds one launcher script, `kubectl-gluon`: it runs the plugin from the gluon-rollout Python
package (the code is Python, its dependencies are compiled per platform, so the package is installed with
pip, not unpacked by krew) and, where that package is missing, says how to install it. The archive is
byte-for-byte reproducible (fixed times, owners and order), so the manifest's sha256 can be checked here.
Install from a checkout: `kubectl krew install --manifest=examples/krew/gluon.yaml
--archive=dist/kubectl-gluon-v0.1.0.tar.gz`.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import sys
import tarfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "examples/krew/gluon.yaml"
HOME = "https://github.com/gluon-rollout/gluon-rollout"  # the chart's `home`

LAUNCHER = """#!/bin/sh
# kubectl gluon, as krew installs it: runs the plugin from the gluon-rollout Python package.
# KUBECTL_GLUON_PYTHON picks the Python (default: python3 on PATH).
exec "${KUBECTL_GLUON_PYTHON:-python3}" -c '
import sys
try:
    from gluon_operator.kubectl_plugin.cli import main
except ImportError as exc:
    sys.stderr.write(
        "kubectl gluon needs the gluon-rollout Python package (Python 3.11 or newer) for " + sys.executable
        + " (" + str(exc) + "):\\n  " + sys.executable + " -m pip install \\"gluon-rollout @ git+HOME\\"\\n"
        "or set KUBECTL_GLUON_PYTHON to a Python that has it\\n"
    )
    raise SystemExit(1)
sys.argv[0] = "kubectl-gluon"
raise SystemExit(main())
' "$@"
""".replace("HOME", HOME)


def version() -> str:
    return "v" + tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def archive_bytes() -> bytes:
    """A .tar.gz of the launcher, the same bytes on every build."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        data = LAUNCHER.encode()
        info = tarfile.TarInfo("kubectl-gluon")
        info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o755, 0, 0, 0
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def manifest_sha256s(text: str) -> list[str]:
    import yaml

    return [p["sha256"] for p in yaml.safe_load(text)["spec"]["platforms"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "dist"), help="where the archive goes")
    parser.add_argument("--check", action="store_true", help="compare the manifest's sha256 with the archive's")
    args = parser.parse_args()
    data = archive_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if args.check:
        stale = [s for s in manifest_sha256s(MANIFEST.read_text()) if s != digest]
        if stale:
            print(f"{MANIFEST}: sha256 {stale[0]} is not the archive's {digest}: update the manifest", file=sys.stderr)
            return 1
        print(f"{MANIFEST}: sha256 {digest} matches")
        return 0
    out = Path(args.out) / f"kubectl-gluon-{version()}.tar.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"{out} sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
