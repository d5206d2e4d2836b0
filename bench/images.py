"""Build time and size of the harness's container images (buildah, no daemon; bases from Debian's packages by
mmdebstrap), and a real node's bring-up time. Prints JSON.

python bench/images.py --json [--cold] [--node]

--cold deletes the cached archives first (.cluster/images), so every image is built again: the cold build's
extra cost on a fresh machine, bar Debian's and PyPI's downloads being warm in no cache of ours (buildah keeps
none: each base layer is bootstrapped again). --node also starts a control plane and one real node with the
agent and serving images imported, and times its bring-up (start to Ready).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from gluon_localcluster import images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--cold", action="store_true", help="rebuild every image (cached archives deleted)")
    parser.add_argument("--node", action="store_true", help="also time one real node's bring-up")
    args = parser.parse_args()
    if args.cold:
        for archive in images.images_dir().glob("*.tar"):
            archive.unlink()
    report: dict = {
        "bench": "images",
        "machine": f"{platform.node()} {platform.machine()} cpus={os.cpu_count()}",
        "cold": args.cold,
        "images": {},
    }
    built = {}
    for build in (
        images.pause_image,
        images.base_image,
        images.serving_image,
        images.operator_image,
        images.agent_image,
    ):
        started = time.monotonic()
        image = build()
        built[image.name] = image
        report["images"][image.name] = {
            "build_seconds": round(image.seconds, 1),
            "call_seconds": round(time.monotonic() - started, 1),  # includes the images it is built FROM
            "archive_bytes": image.bytes,
        }
    if args.node:
        from gluon_localcluster import ControlPlane
        from gluon_localcluster.realnode import RealNode

        with ControlPlane(Path(tempfile.mkdtemp(prefix="gluon-bench-node-")), kwok=False) as cp:
            node = RealNode(cp, "bench-real", images=[built[images.AGENT_IMAGE], built[images.SERVING_IMAGE]])
            with node:
                report["node_bringup_seconds"] = round(node.started_seconds, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
