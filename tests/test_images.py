"""The harness's image cache (localcluster/gluon_localcluster/images.py): keys, the disk check, and buildah's
storage left empty between builds (the archives are the cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gluon_localcluster import images

CONTAINERFILE = images.NODE_DIR / "serving" / "Containerfile"


def built(archive: Path) -> images.Built:
    return images.Built("localhost/base:x", archive, 0.0, 1)


def test_a_base_counts_in_the_key_by_its_archive_name_not_its_path():
    key = lambda base: images.cache_key("n", [CONTAINERFILE], {}, None, "", base)  # noqa: E731
    here, there = built(Path("/a/.cluster/images/base-1.tar")), built(Path("/b/.cluster/images/base-1.tar"))
    assert key(("BASE", here)) == key(("BASE", there))
    assert key(("BASE", here)) != key(("BASE", built(Path("/a/.cluster/images/base-2.tar"))))
    assert key(("BASE", here)) != key(("OTHER_ARG", here)) != key(None)


def test_a_build_names_its_base_by_archive():
    assert built(Path("/x/base-1.tar")).reference == "docker-archive:/x/base-1.tar"


def test_too_little_disk_fails_before_the_build_and_says_how_much(tmp_path):
    with pytest.raises(RuntimeError, match=r"needs 1048576\.0 GiB free on the filesystem of .*; it has [0-9.]+ GiB"):
        images.require_free_disk(tmp_path, need=2**50)
    images.require_free_disk(tmp_path, need=1)


def test_the_storage_holds_no_image_between_builds():
    """`make test` built every image before the suite: their archives exist, buildah's storage is empty."""
    names = [make().archive for make in images.ALL]  # all cached: no build here
    assert all(path.is_file() for path in names)
    assert images._buildah("images", "--quiet").split() == []
    assert images._buildah("containers", "--quiet").split() == []
