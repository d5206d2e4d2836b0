"""gluon_common.image_ref: what each runtime writes in `imageID`, and what a new pod on the node can run by it."""

from __future__ import annotations

import hashlib

import pytest

from gluon_common import image_ref
from gluon_common.image_ref import ImageIdentity, identify, node_local, short


def sha(what: str) -> str:
    return "sha256:" + hashlib.sha256(what.encode()).hexdigest()


INDEX = sha("rocm/sglang:v0.4.6 index")  # a multi-platform index: what containerd names a tag pull by
MANIFEST = sha("rocm/sglang:v0.4.6 linux/amd64 manifest")
OLD = sha("rocm/sglang:v0.4.5 index")
CONFIG = sha("rocm/sglang:v0.4.6 config")
NGINX = sha("nginx:1.27 index")
# The harness's serving image as `ctr images import` leaves it (its archive's manifest.json Config, 2026-12-05).
HARNESS_CONFIG = "sha256:0e0aeda76e9d806abf5d6dd1152dc563ceb52b276672dafdbcbe319c9d0c7357"
HARNESS_TAG = "localhost/gluon-serving-simulation:local"
SHA512 = "sha512:" + hashlib.sha512(b"rocm/sglang").hexdigest()
UPPER = "sha256:" + CONFIG.split(":")[1].upper()
TAG = "docker.io/rocm/sglang:v0.4.6"


def hexof(digest: str) -> str:
    return digest.split(":", 1)[1]


# (case, spec image, status image, imageID, digest, pinned, words the problem says)
KNOWN = [
    # ---- containerd (CRI image_ref: repoDigests[0] if any, else the config digest)
    (
        "containerd, pulled by tag: the index digest it was pulled by",
        "rocm/sglang:v0.4.6",
        TAG,
        f"docker.io/rocm/sglang@{INDEX}",
        INDEX,
        f"docker.io/rocm/sglang@{INDEX}",
    ),
    (
        "containerd, an official image normalised as containerd writes it",
        "nginx:1.27",
        "docker.io/library/nginx:1.27",
        f"docker.io/library/nginx@{NGINX}",
        NGINX,
        f"docker.io/library/nginx@{NGINX}",
    ),
    (
        "containerd, a spec by tag and a mirror's repository: the runtime's is kept",
        "registry.example.com/ml/sglang:v0.4.6",
        "mirror.internal:5000/ml/sglang:v0.4.6",
        f"mirror.internal:5000/ml/sglang@{INDEX}",
        INDEX,
        f"mirror.internal:5000/ml/sglang@{INDEX}",
    ),
    (
        "containerd, a spec pinned by the same digest (tag and digest): they agree",
        f"registry.example.com/ml/sglang:v0.4.6@{INDEX}",
        "registry.example.com/ml/sglang:v0.4.6",
        f"registry.example.com/ml/sglang@{INDEX}",
        INDEX,
        f"registry.example.com/ml/sglang@{INDEX}",
    ),
    (
        "containerd, the spec's image changed in place: the running container's digest, not the spec's",
        f"registry.example.com/ml/sglang@{INDEX}",
        "registry.example.com/ml/sglang:v0.4.5",
        f"registry.example.com/ml/sglang@{OLD}",
        OLD,
        f"registry.example.com/ml/sglang@{OLD}",
    ),
    (
        "containerd, a pull by platform manifest digest",
        f"ghcr.io/acme/inference/sglang@{MANIFEST}",
        f"ghcr.io/acme/inference/sglang@{MANIFEST}",
        f"ghcr.io/acme/inference/sglang@{MANIFEST}",
        MANIFEST,
        f"ghcr.io/acme/inference/sglang@{MANIFEST}",
    ),
    (
        "containerd, an IPv6 registry with a port",
        "[fd00::10]:5000/ml/sglang:v0.4.6",
        "[fd00::10]:5000/ml/sglang:v0.4.6",
        f"[fd00::10]:5000/ml/sglang@{INDEX}",
        INDEX,
        f"[fd00::10]:5000/ml/sglang@{INDEX}",
    ),
    (
        "containerd, a localhost registry",
        "localhost:5000/sglang:dev",
        "localhost:5000/sglang:dev",
        f"localhost:5000/sglang@{INDEX}",
        INDEX,
        f"localhost:5000/sglang@{INDEX}",
    ),
    (
        "containerd, a name with a tag and a digest: the tag is dropped as containerd's ParseDockerRef does",
        "quay.io/acme/sglang:v1",
        "quay.io/acme/sglang:v1",
        f"quay.io/acme/sglang:v1@{INDEX}",
        INDEX,
        f"quay.io/acme/sglang@{INDEX}",
    ),
    (
        "containerd, the legacy Docker Hub name",
        "index.docker.io/rocm/sglang:v0.4.6",
        TAG,
        f"index.docker.io/rocm/sglang@{INDEX}",
        INDEX,
        f"docker.io/rocm/sglang@{INDEX}",
    ),
    (
        "containerd, an image imported with ctr (the harness): its bare config digest, node-local",
        HARNESS_TAG,
        HARNESS_TAG,
        HARNESS_CONFIG,
        HARNESS_CONFIG,
        HARNESS_CONFIG,
    ),
    (
        "containerd, a self-test pod that itself ran by the bare image ID",
        HARNESS_CONFIG,
        HARNESS_TAG,
        HARNESS_CONFIG,
        HARNESS_CONFIG,
        HARNESS_CONFIG,
    ),
    (
        "containerd, an imported image whose spec names a digest: the image ID decides",
        f"registry.example.com/ml/sglang@{INDEX}",
        HARNESS_TAG,
        CONFIG,
        CONFIG,
        CONFIG,
    ),
    # ---- CRI-O (RepoDigests[0], fully qualified)
    (
        "CRI-O, pulled from a registry",
        "quay.io/rocm/sglang:v0.4.6",
        "quay.io/rocm/sglang:v0.4.6",
        f"quay.io/rocm/sglang@{MANIFEST}",
        MANIFEST,
        f"quay.io/rocm/sglang@{MANIFEST}",
    ),
    # ---- cri-dockerd (docker-pullable:// + Docker's RepoDigests[0], familiar names)
    (
        "cri-dockerd, an official image by its familiar name",
        "nginx:1.27",
        "nginx:1.27",
        f"docker-pullable://nginx@{NGINX}",
        NGINX,
        f"docker.io/library/nginx@{NGINX}",
    ),
    (
        "cri-dockerd, a Docker Hub user image",
        "rocm/sglang:v0.4.6",
        "rocm/sglang:v0.4.6",
        f"docker-pullable://rocm/sglang@{INDEX}",
        INDEX,
        f"docker.io/rocm/sglang@{INDEX}",
    ),
    (
        "cri-dockerd, a private registry with a port",
        "registry.example.com:5000/ml/sglang:v0.4.6",
        "registry.example.com:5000/ml/sglang:v0.4.6",
        f"docker-pullable://registry.example.com:5000/ml/sglang@{INDEX}",
        INDEX,
        f"registry.example.com:5000/ml/sglang@{INDEX}",
    ),
]

# (case, spec image, status image, imageID, digest, words the problem says): pinned is None in each.
UNPINNABLE = [
    (
        "cri-dockerd, an image with no repository digest (docker load / build): Docker's image ID",
        "sglang:local",
        "sglang:local",
        f"docker://{CONFIG}",
        CONFIG,
        ["cri-dockerd", "Docker's image ID", "no repository digest", "registry", "'sglang:local'"],
    ),
    (
        "cri-dockerd, Docker's image ID while the spec names a digest: the spec is not trusted",
        f"registry.example.com/ml/sglang@{INDEX}",
        "sglang:local",
        f"docker://{CONFIG}",
        CONFIG,
        ["cri-dockerd", "runs no pod by an image ID"],
    ),
    (
        "CRI-O, a locally built image: its storage ID, 64 hex without sha256:",
        "localhost/sglang:dev",
        "localhost/sglang:dev",
        hexof(CONFIG),
        CONFIG,
        ["CRI-O", "storage image ID", "64-hex", "'localhost/sglang:dev'"],
    ),
]

# (case, imageID, words the problem says): digest and pinned are None in each.
REFUSED = [
    ("no imageID: the container has not started", None, ["no imageID yet", "not been created or started"]),
    ("an empty imageID", "", ["no imageID yet"]),
    ("a blank imageID", "   ", ["no imageID yet"]),
    ("a bare sha512 image ID", SHA512, ["sha512", "sha256 digests only"]),
    ("a sha512 repository digest", f"quay.io/rocm/sglang@{SHA512}", ["sha512", "sha256 digests only"]),
    ("a sha512 docker-pullable digest", f"docker-pullable://rocm/sglang@{SHA512}", ["sha512"]),
    ("an uppercase image ID", UPPER, ["uppercase hex"]),
    ("an uppercase repository digest", f"docker.io/rocm/sglang@{UPPER}", ["uppercase hex"]),
    ("an uppercase Docker image ID", f"docker://{UPPER}", ["docker://", "uppercase hex"]),
    ("an uppercase algorithm", "SHA256:" + hexof(CONFIG), ["SHA256", "sha256 digests only"]),
    ("a short image ID", "sha256:0e0aeda76e9d", ["not 64 lowercase hex", "12 characters"]),
    ("a 63-hex image ID", HARNESS_CONFIG[:-1], ["not 64 lowercase hex", "63 characters"]),
    ("a non-hex image ID", "sha256:" + "g" * 64, ["not 64 lowercase hex"]),
    ("a short repository digest", "docker.io/rocm/sglang@sha256:0d17b565c37b", ["not 64 lowercase hex"]),
    ("a tag where the digest goes", "docker.io/rocm/sglang@latest", ["'latest' is not a digest"]),
    ("64 uppercase hex (no CRI-O ID)", hexof(CONFIG).upper(), ["names no digest"]),
    ("a tag, no digest", TAG, ["names no digest"]),
    ("a repository, no digest", "docker.io/rocm/sglang", ["names no digest"]),
    ("a repository with uppercase letters", f"docker.io/ROCm/sglang@{INDEX}", ["uppercase letters"]),
    ("a digest without a repository", f"@{INDEX}", ["no repository"]),
    ("a repository that is 64 hex", f"{hexof(CONFIG)}@{INDEX}", ["64-hex"]),
    ("an empty path component", f"registry.example.com//sglang@{INDEX}", ["not a valid repository name"]),
    ("two digests", f"docker.io/rocm/sglang@{OLD}@{INDEX}", ["not a valid repository name"]),
    ("a repository path over 255 characters", f"registry.example.com/{'a' * 256}@{INDEX}", ["longer than 255"]),
    ("a docker-pullable:// image ID", f"docker-pullable://{CONFIG}", ["must be a repository digest"]),
    ("a docker:// repository digest", f"docker://rocm/sglang@{INDEX}", ["must be Docker's image ID"]),
    ("an unknown prefix", f"containerd://{CONFIG}", ["containerd://", "no runtime prefix"]),
    ("rkt's old prefix", "rkt://sha512-" + "a" * 64, ["rkt://", "no runtime prefix"]),
    ("surrounding whitespace", f" {CONFIG}", ["whitespace"]),
    ("a trailing newline", f"{CONFIG}\n", ["whitespace"]),
]


def assert_sentence(problem: str | None, words: list[str]) -> None:
    assert problem, "a problem must be said"
    assert problem == problem.strip() and "None" not in problem and len(problem) > 40
    for word in words:
        assert word in problem, f"{word!r} not in {problem!r}"


@pytest.mark.parametrize(("case", "spec", "status", "image_id", "digest", "pinned"), KNOWN, ids=[k[0] for k in KNOWN])
def test_known_image_is_pinned(case, spec, status, image_id, digest, pinned):
    assert identify(spec, status, image_id) == ImageIdentity(digest, pinned, None)


@pytest.mark.parametrize(
    ("case", "spec", "status", "image_id", "digest", "words"), UNPINNABLE, ids=[u[0] for u in UNPINNABLE]
)
def test_digest_known_but_no_reference_runs_it(case, spec, status, image_id, digest, words):
    identity = identify(spec, status, image_id)
    assert (identity.digest, identity.pinned) == (digest, None)
    assert_sentence(identity.problem, words)


@pytest.mark.parametrize(("case", "image_id", "words"), REFUSED, ids=[r[0] for r in REFUSED])
def test_unusable_image_id_gives_neither(case, image_id, words):
    identity = identify(TAG, TAG, image_id)
    assert (identity.digest, identity.pinned) == (None, None)
    assert_sentence(identity.problem, words)
    if image_id and image_id.strip():
        assert repr(image_id) in identity.problem  # the person sees what the runtime wrote


def test_not_started_names_what_the_pod_asks_for():
    assert "'rocm/sglang:v0.4.6'" in (identify("rocm/sglang:v0.4.6", "rocm/sglang:v0.4.6", None).problem or "")
    assert identify("", None, None).problem == (
        "the runtime reported no imageID yet: the container has not been created or started, so which image it "
        "runs is not known"
    )


@pytest.mark.parametrize(
    ("spec", "status"),
    [("", None), ("", "localhost/x:y"), ("registry.example.com/ml/sglang@" + OLD, None), ("not a ref!", "??")],
)
def test_only_the_image_id_decides(spec, status):
    """The spec and status images are requests and names, never content: they change no digest or pinned."""
    for image_id in (f"docker.io/rocm/sglang@{INDEX}", HARNESS_CONFIG, f"docker-pullable://nginx@{NGINX}"):
        baseline = identify(TAG, TAG, image_id)
        other = identify(spec, status, image_id)
        assert (other.digest, other.pinned) == (baseline.digest, baseline.pinned)


ALL_IMAGE_IDS = [k[3] for k in KNOWN] + [u[3] for u in UNPINNABLE] + [r[1] for r in REFUSED]


@pytest.mark.parametrize("image_id", ALL_IMAGE_IDS)
def test_pinned_never_names_other_content(image_id):
    """Strictness: a pinned reference is content-addressed by exactly the digest reported, or is that digest."""
    identity = identify(TAG, TAG, image_id)
    assert (identity.problem is None) == (identity.digest is not None and identity.pinned is not None)
    if identity.digest is not None:
        assert image_ref.DIGEST.fullmatch(identity.digest)
    if identity.pinned is not None:
        if identity.pinned != identity.digest:
            repository, digest = identity.pinned.rsplit("@", 1)
            assert digest == identity.digest
            assert ":" not in repository.rsplit("/", 1)[-1], "no tag in a pinned reference"


def test_node_local_only_for_a_bare_image_id():
    harness = identify(HARNESS_TAG, HARNESS_TAG, HARNESS_CONFIG)
    assert harness.node_local and node_local(HARNESS_CONFIG)
    pulled = identify(TAG, TAG, f"docker.io/rocm/sglang@{INDEX}")
    assert not pulled.node_local and not node_local(pulled.pinned or "")
    assert not identify(TAG, TAG, None).node_local
    assert not identify(TAG, TAG, f"docker://{CONFIG}").node_local


def test_short_is_a_label_value():
    assert short(HARNESS_CONFIG) == "0e0aeda76e9d"
    assert short(INDEX) == hexof(INDEX)[:12] and len(short(INDEX)) <= 63


@pytest.mark.parametrize("bad", ["", hexof(CONFIG), UPPER, SHA512, "sha256:0e0aeda76e9d", f"docker://{CONFIG}"])
def test_short_refuses_what_is_no_digest(bad):
    with pytest.raises(ValueError, match="not a sha256 digest"):
        short(bad)
