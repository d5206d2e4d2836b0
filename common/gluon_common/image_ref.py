"""Which image a container really runs, from what its kubelet reports, and a reference a new pod on the same
node runs exactly that image by (stdlib only: this module is copied into foreign images).

What the kubelet writes (kubernetes/kubernetes)
-----------------------------------------------
`status.containerStatuses[].imageID` is the CRI `ContainerStatus.image_ref`, verbatim:
`pkg/kubelet/kubelet_pods.go` (df5f0243) `convertToAPIContainerStatuses` sets `ImageID: cs.ImageRef` ("Converting
the digested image ref to the Kubernetes public ContainerStatus.ImageID is historically intentional and should not
change"). The newer CRI field `image_id` (the node-local image ID, "added in v1.30") only feeds the kubelet's
internal `kubecontainer.Status.ImageID` (`pkg/kubelet/kuberuntime/kuberuntime_container.go` fbba6b47
`toKubeContainerStatus`); the API never shows it. Until the runtime has created the container the kubelet writes
`image` = the spec's image and no `imageID` (`convertToAPIContainerStatuses`, default waiting state).
`docker-pullable://` and `docker://` are dockershim's prefixes, kept by cri-dockerd.

What each runtime puts in `image_ref`
-------------------------------------
* containerd CRI (containerd/containerd 301026e5 `internal/cri/server/container_status.go`; the same in v1.6.20
  2806fc10 `pkg/cri/server/container_status.go`): the container's image ID (config digest) is looked up and
  replaced by `repoDigests[0]` when the image has any repository digest; `repoDigests` are the image's containerd
  names that parse as `name@digest` (`internal/cri/util/references.go` `ParseImageReferences`, fully normalised:
  `docker.io/library/nginx@sha256:...`; names sorted by `distribution/reference.Sort`, so with several the
  alphabetically first). A pull names the image `<config digest>`, `<repo>:<tag>` and `<repo>@<target digest>`
  (`internal/cri/server/images/image_pull.go`, `util.GetRepoDigestAndTag`): the target is what the reference
  resolved to, i.e. the *index* digest for a multi-platform image. So a pulled image reports
  `repo@sha256:<manifest or index>`; an image with no `name@digest` name (imported, built locally) reports its
  bare config digest `sha256:<hex>`.
* CRI-O (cri-o/cri-o f954a17e `internal/oci/container.go` `NewContainer`, `server/container_create.go`):
  `RepoDigests[0]` else the containers/storage image ID, which is **64 hex without `sha256:`**
  (`internal/storage/image_id.go`). CRI-O's repo digests are every known repository × every manifest digest of
  the image (`internal/storage/image.go` `makeRepoDigests`: "may create digested references that never existed
  on those registries"): content-addressed, resolvable on that node, not necessarily pullable elsewhere.
* cri-dockerd (Mirantis/cri-dockerd 246bd657 `core/convert.go` `toPullableImageID`, `core/container_status.go`):
  `docker-pullable://` + Docker's `RepoDigests[0]` (familiar form: `nginx@sha256:...`), else `docker://` + the
  Docker image ID (`sha256:<config>`).

What a new pod can name (pinned)
--------------------------------
* `repo@sha256:D` (any runtime's repo digest): content-addressed. The kubelet parses it as a digest reference
  (`pkg/kubelet/images/image_manager.go` `applyDefaultImageTag` -> `pkg/util/parsers` `ParseImageName` ->
  `distribution/reference.ParseNormalizedNamed`), the runtime finds it locally by that name, and a pull of it
  from any registry can only yield that manifest/index (on the same node, the same platform's image).
* bare `sha256:C` on containerd: pinnable **on a node that holds the image**. containerd's CRI resolves every
  image reference with `LocalResolve` (`internal/cri/server/images/service.go`; v1.6.20 `pkg/cri/server/
  helpers.go` `localResolve`), which tries `digest.Parse(ref)` first and takes a valid digest as the image ID
  (its own `TestLocalResolve` resolves `sha256:<config>`); `ImageStatus` and `CreateContainer` both go through
  it. The kubelet accepts the string: `ParseNormalizedNamed("sha256:<64 hex>")` is the *name*
  `docker.io/library/sha256` with *tag* `<64 hex>` (only a bare 64-hex string is rejected), so the default pull
  policy is IfNotPresent and `applyDefaultImageTag` leaves it alone. Node-local only: where the image is
  missing, a pull would ask Docker Hub for `library/sha256:<hex>`, so such a reference must run with
  `imagePullPolicy: Never` (see `node_local`).
* `docker://sha256:C` (cri-dockerd): not pinnable. cri-dockerd's `ImageStatus` rejects image IDs
  (`libdocker/helpers.go` `matchImageTagOrSHA`: "It should fail on things like image IDs (config digests)"), and
  `repo@sha256:<image ID>` fails earlier in Docker's own lookup (moby/moby `daemon/images/image.go` `getImage`
  finds a named reference only through its reference store).
* CRI-O's bare 64-hex ID: not pinnable: the kubelet refuses a 64-hex image name ("cannot specify 64-byte
  hexadecimal strings", `ParseNormalizedNamed`), and `sha256:<hex>` is no CRI-O image ID form.
* A tag (the spec's `image`, or `status.image`, which is the runtime's first repo tag) is never pinned.

The spec's image is a request, not a record: a pod's image may be changed in place while the reported container
still runs the old one, and a digest in the spec cannot be compared with a config digest. So only `imageID`
decides `digest` and `pinned`; the spec's and status's images only help explain a problem.

The local harness (localcluster/gluon_localcluster/realnode.py `_import_images`) runs `ctr images import
<docker-archive>` into containerd 1.6.20's `k8s.io` namespace. Without `--digests` (default false,
`cmd/ctr/commands/images/import.go`; `import.go` adds `name@digest` records only with `WithDigestRef`) the image
gets one name, its archive's RepoTag (`localhost/gluon-serving-simulation:local`), so its containers report
`image: localhost/gluon-serving-simulation:local`, `imageID: sha256:<config digest>` (the archive's
`manifest.json` `Config` file name), and `pinned` is that bare `sha256:...`, which runs there with Never or
IfNotPresent.

Decision table (imageID shape -> digest / pinned / problem):

| imageID                                   | digest     | pinned                       | problem        |
|-------------------------------------------|------------|------------------------------|----------------|
| missing, empty, blank                     | None       | None                         | not started    |
| `repo[:tag]@sha256:D` (containerd, CRI-O) | sha256:D   | normalised `repo@sha256:D`   | None           |
| `docker-pullable://repo@sha256:D`         | sha256:D   | normalised `repo@sha256:D`   | None           |
| `sha256:C` (containerd image ID)          | sha256:C   | `sha256:C` (node-local)      | None           |
| `docker://sha256:C` (cri-dockerd)         | sha256:C   | None                         | not pinnable   |
| `<64 hex>` (CRI-O storage ID)             | sha256:hex | None                         | not pinnable   |
| sha512 or another algorithm               | None       | None                         | not sha256     |
| uppercase / short / non-hex digest, bad repository name, tag only, unknown `scheme://` | None | None | malformed |
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
SHORT_HEX = 12  # short(): as Docker shortens image IDs; well within a label value's 63 characters

_HEX64 = re.compile(r"[0-9a-f]{64}")
# distribution/reference regexp.go (vendored in containerd: vendor/github.com/distribution/reference/regexp.go).
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_HOST}(?::[0-9]+)?)/)?"
    rf"(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?",
    re.ASCII,
)
_DIGEST_SHAPED = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")  # digestPat
_PATH_MAX = 255  # RepositoryNameTotalLengthMax
_SCHEME = re.compile(r"([a-z][a-z0-9+.-]*)://(.*)", re.DOTALL)


@dataclass(frozen=True)
class ImageIdentity:
    """`digest`: "sha256:<64 lowercase hex>" the runtime identifies the running image by, None when unknown.
    `pinned`: a reference a new pod on the same node runs exactly that image by, None when there is none.
    `problem`: why `digest` or `pinned` is None, as a sentence; None when both are known."""

    digest: str | None
    pinned: str | None
    problem: str | None

    @property
    def node_local(self) -> bool:
        """Whether `pinned` runs only where the image already is (a bare image ID): use imagePullPolicy Never."""
        return self.pinned is not None and node_local(self.pinned)


def identify(spec_image: str, status_image: str | None, image_id: str | None) -> ImageIdentity:
    """The image a container runs, from its pod's `spec.containers[].image` (`spec_image`) and its
    `status.containerStatuses[]` `image` and `imageID` (see the module's table)."""
    if image_id is None or not image_id.strip():
        asked = f" (it asks for {spec_image or status_image!r})" if spec_image or status_image else ""
        return ImageIdentity(
            None,
            None,
            "the runtime reported no imageID yet: the container has not been created or started, so which image "
            f"it runs is not known{asked}",
        )
    if image_id != image_id.strip():
        return _bad(image_id, "it has surrounding whitespace, which no kubelet writes")
    scheme = _SCHEME.fullmatch(image_id)
    if scheme is None:
        return _cri(image_id, _named(spec_image, status_image))
    kind, rest = scheme.groups()
    if kind == "docker-pullable":
        if "@" not in rest:
            return _bad(image_id, "a docker-pullable:// imageID must be a repository digest (repo@sha256:...)")
        return _repo_digest(image_id, rest)
    if kind == "docker":
        digest, why = _digest(rest)
        if digest is None:
            detail = f"; {why}" if rest.startswith("sha256:") else ""
            return _bad(image_id, f"a docker:// imageID must be Docker's image ID sha256:<64 hex>{detail}")
        return ImageIdentity(
            digest,
            None,
            f"cri-dockerd reported only Docker's image ID ({image_id}), as it does when the image has no repository "
            "digest on the node, and cri-dockerd runs no pod by an image ID: push the image to a registry and run "
            f"the pods by repo@sha256{_named(spec_image, status_image)}",
        )
    return _bad(image_id, f"{kind}:// is no runtime prefix this module knows (docker://, docker-pullable://)")


def _named(spec_image: str, status_image: str | None) -> str:
    name = status_image or spec_image
    return f" (its name: {name!r})" if name else ""


def _cri(image_id: str, named: str) -> ImageIdentity:
    """An imageID without a prefix: containerd's or CRI-O's."""
    if "@" in image_id:
        return _repo_digest(image_id, image_id)
    if _HEX64.fullmatch(image_id):
        return ImageIdentity(
            "sha256:" + image_id,
            None,
            f"the runtime (CRI-O) reported only its storage image ID {image_id}, as it does for an image with no "
            "repository digest on the node, and no pod can name an image by a bare 64-hex ID: push the image to a "
            f"registry and run the pods by repo@sha256{named}",
        )
    algorithm, colon, _ = image_id.partition(":")
    if colon and (algorithm == "sha256" or _DIGEST_SHAPED.fullmatch(image_id)):
        digest, why = _digest(image_id)
        if digest is None:
            return _bad(image_id, why)
        return ImageIdentity(digest, digest, None)  # containerd's image ID: its LocalResolve takes it as is
    return _bad(image_id, "it names no digest: neither repo@sha256:<64 hex> nor an image ID sha256:<64 hex>")


def _repo_digest(image_id: str, reference: str) -> ImageIdentity:
    name, digest_part = reference.rsplit("@", 1)
    digest, why = _digest(digest_part)
    if digest is None:
        return _bad(image_id, why)
    repository, why = _normalized_name(name)
    if repository is None:
        return _bad(image_id, why)
    return ImageIdentity(digest, f"{repository}@{digest}", None)


def _digest(value: str) -> tuple[str | None, str]:
    """(the sha256 digest `value` is, or None with why not)."""
    if DIGEST.fullmatch(value):
        return value, ""
    algorithm, colon, encoded = value.partition(":")
    if not colon or not algorithm:
        return None, f"{value!r} is not a digest (algorithm:hex)"
    if algorithm != "sha256":
        return None, (
            f"its digest uses {algorithm}, and gluon-rollout identifies images by sha256 digests only, so nothing "
            "could match it"
        )
    if re.fullmatch(r"[0-9a-fA-F]{64}", encoded):
        return None, "its sha256 digest has uppercase hex digits, which no runtime writes (digests are lowercase)"
    return None, f"its sha256 digest is not 64 lowercase hex digits ({len(encoded)} characters: {encoded[:16]!r})"


def _normalized_name(name: str) -> tuple[str | None, str]:
    """A repository name (an optional tag dropped) as distribution/reference.ParseNormalizedNamed reads it,
    fully qualified as containerd writes it (`nginx` -> `docker.io/library/nginx`), or None with why not."""
    if not name:
        return None, "it has a digest but no repository before the '@'"
    if _HEX64.fullmatch(name):
        return None, "its repository is a 64-hex string, which no image name may be"
    first, slash, rest = name.partition("/")  # splitDockerDomain (normalize.go)
    if not slash:
        domain, remainder = "docker.io", name
    elif first == "localhost":
        domain, remainder = first, rest
    elif first == "index.docker.io":
        domain, remainder = "docker.io", rest
    elif "." in first or ":" in first or first.lower() != first:
        domain, remainder = first, rest
    else:
        domain, remainder = "docker.io", name
    if domain == "docker.io" and "/" not in remainder:
        remainder = "library/" + remainder
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        return None, f"its repository {remote!r} has uppercase letters, which no image name may have"
    match = _REFERENCE.fullmatch(f"{domain}/{remainder}")
    if match is None or match["digest"] is not None:
        return None, f"{name!r} is not a valid repository name"
    if len(match["path"]) > _PATH_MAX:
        return None, f"its repository path is longer than {_PATH_MAX} characters"
    return f"{match['domain']}/{match['path']}", ""


def _bad(image_id: str, why: str) -> ImageIdentity:
    return ImageIdentity(None, None, f"the runtime's imageID {image_id!r} is not usable: {why}")


def node_local(pinned: str) -> bool:
    """A bare image ID (sha256:...) runs only where that image already is: no registry can give it, and a pull of
    it would ask Docker Hub for `library/sha256:<hex>` (run it with imagePullPolicy Never)."""
    return DIGEST.fullmatch(pinned) is not None


def is_digest(value: object) -> bool:
    return isinstance(value, str) and DIGEST.fullmatch(value) is not None


def short(digest: str) -> str:
    """The first 12 hex digits of a sha256 digest, for labels and messages."""
    if not is_digest(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return digest[len("sha256:") : len("sha256:") + SHORT_HEX]
