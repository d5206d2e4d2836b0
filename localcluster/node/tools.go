//go:build tools

// Package node only pins the kubelet built for the harness's real nodes.
package node

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
