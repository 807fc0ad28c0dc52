//go:build tools

// Package tools pins containerd, built by ../build-node.sh.
package tools

import (
	_ "github.com/containerd/containerd/cmd/containerd"
)
