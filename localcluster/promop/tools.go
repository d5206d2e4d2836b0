//go:build tools

// Test and demo tooling only, no product code: pins the commands build.sh builds.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
