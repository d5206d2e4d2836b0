#!/usr/bin/env bash
# Builds the Prometheus Operator (test and demo tooling only, never product code) from its Go module at the
# release pinned in pins.env, into .cluster/bin, with its CRDs from the same module into .cluster/promop-crds,
# and Prometheus at the version that module requires, with Kubernetes service discovery (pins.env says why).
# Separate from localcluster/k8s so that its pins never change the control plane's stamp. A no-op while its
# own stamp (the hash of the files here) matches.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="${CLUSTER_BIN:-$root/.cluster/bin}"
crds="$out/../promop-crds"
source "$here/pins.env"
stamp="$out/.promop-$(cat "$here/pins.env" "$here/go.mod" "$here/go.sum" "$here/tools.go" "$here/build.sh" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi

command -v go >/dev/null || { echo "promop/build.sh: Go is required to build the Prometheus Operator" >&2; exit 1; }
mkdir -p "$out" "$crds"
start=$(date +%s)
module=github.com/prometheus-operator/prometheus-operator
version_pkg=github.com/prometheus/common/version
ldflags="-s -w -X $version_pkg.Version=${PROMETHEUS_OPERATOR_VERSION#v} -X $version_pkg.Branch=release
 -X $version_pkg.Revision=$PROMETHEUS_OPERATOR_VERSION -X $version_pkg.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
cd "$here"
echo "promop/build.sh: building the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION and Prometheus $PROMETHEUS_VERSION into $out"
export CGO_ENABLED=0
# go build fetches the pinned modules it lacks from the module proxy: retried (.ci/retry).
"$root/.ci/retry" go build -trimpath -ldflags "$(echo $ldflags)" -o "$out/prometheus-operator" "$module/cmd/operator"
required=$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
[ "$required" = "$PROMETHEUS_MODULE_VERSION" ] || { echo "promop/build.sh: go.mod requires Prometheus $required, pins.env says $PROMETHEUS_MODULE_VERSION" >&2; exit 1; }
prom_ldflags="-s -w -X $version_pkg.Version=${PROMETHEUS_VERSION#v} -X $version_pkg.Branch=release
 -X $version_pkg.Revision=$PROMETHEUS_VERSION -X $version_pkg.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
"$root/.ci/retry" go build -trimpath -tags remove_all_sd,enable_kubernetes_sd -ldflags "$(echo $prom_ldflags)" \
  -o "$out/prometheus" github.com/prometheus/prometheus/cmd/prometheus
src="$(go env GOMODCACHE)/$module@$PROMETHEUS_OPERATOR_VERSION/example/prometheus-operator-crd"
rm -f "$crds"/*.yaml
cp "$src"/monitoring.coreos.com_*.yaml "$crds/"
chmod u+w "$crds"/*.yaml
rm -f "$out"/.promop-*
echo "{\"seconds\": $(( $(date +%s) - start )), \"prometheus-operator\": \"$PROMETHEUS_OPERATOR_VERSION\", \"prometheus\": \"$PROMETHEUS_VERSION\", \"go\": \"$(go env GOVERSION)\", \"sizes\": {\"prometheus-operator\": $(stat -c %s "$out/prometheus-operator"), \"prometheus\": $(stat -c %s "$out/prometheus")}}" > "$out/../promop-build.json"
touch "$stamp"
echo "promop/build.sh: done in $(( $(date +%s) - start )) s"
