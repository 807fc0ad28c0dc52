//go:build tools

// Package tools pins the etcd server binary built by ../build.sh.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
