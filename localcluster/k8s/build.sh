#!/usr/bin/env bash
# Builds the control plane used by tests, benches and the demo (never product code) from the pins in
# pins.env and go.mod: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok and
# kwokctl, version-stamped, into .cluster/bin. Rebuilds only when the pins change (a stamp of their hash).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="${CLUSTER_BIN:-$root/.cluster/bin}"
source "$here/pins.env"
stamp="$out/.pins-$(cat "$here/pins.env" "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is required to build the test control plane" >&2; exit 1; }
mkdir -p "$out"
start=$(date +%s)
kube_minor=${KUBERNETES_VERSION#v1.}; kube_minor=${kube_minor%%.*}
date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
component_base=k8s.io/component-base/version
kube_ldflags="-s -w -X $component_base.gitVersion=$KUBERNETES_VERSION -X $component_base.gitMajor=1
 -X $component_base.gitMinor=$kube_minor -X $component_base.gitTreeState=clean
 -X $component_base.gitCommit=release-$KUBERNETES_VERSION -X $component_base.buildDate=$date_utc
 -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
kwok_ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}
 -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBERNETES_VERSION#v} $kube_ldflags"
etcd_ldflags="-s -w"

cd "$here"
echo "build.sh: building Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION into $out"
export CGO_ENABLED=0
# go build fetches the pinned modules it lacks from the module proxy: retried (.ci/retry).
retry="$root/.ci/retry"
"$retry" go build -trimpath -ldflags "$(echo $kube_ldflags)" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
"$retry" go build -trimpath -ldflags "$(echo $kwok_ldflags)" -o "$out/" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
"$retry" go build -trimpath -ldflags "$etcd_ldflags" -o "$out/etcd" go.etcd.io/etcd/server/v3
# kwok's own stage definitions (the ones kwokctl feeds it), from the same module, for the launcher.
stages="$out/../kwok-stages"; mkdir -p "$stages"
kwok_src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
cp "$kwok_src/node/fast/node-initialize.yaml" "$kwok_src/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
   "$kwok_src"/pod/fast/pod-*.yaml "$stages/"
rm -f "$out"/.pins-*
{
  echo "{\"seconds\": $(( $(date +%s) - start )), \"kubernetes\": \"$KUBERNETES_VERSION\", \"etcd\": \"$ETCD_VERSION\", \"kwok\": \"$KWOK_VERSION\", \"built\": \"$date_utc\", \"go\": \"$(go env GOVERSION)\", \"sizes\": {"
  first=1
  for b in "$out"/*; do [ $first = 1 ] || echo ","; first=0; printf '"%s": %s' "$(basename "$b")" "$(stat -c %s "$b")"; done
  echo "}}"
} > "$out/build.json"
touch "$stamp"
echo "build.sh: done in $(( $(date +%s) - start )) s"
