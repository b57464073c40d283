//go:build tools

// Package kube names the commands tools/kube/build.sh builds, so that go
// mod tidy keeps their modules.
package kube

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
