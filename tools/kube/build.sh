#!/bin/sh
# Builds kube-apiserver, kube-scheduler and etcd from the Go module proxy
# through this directory's wrapper module (see go.mod), once: they go to
# a cache directory outside the repo ($AIRLOCK_KUBE_CACHE, default
# /var/cache/airlock/kube as root, else ~/.cache/airlock/kube), named by
# the hash of go.mod and go.sum, and are reused while those stay the same.
# The first build takes about 20 minutes on 2 cores; later ones nothing.
# Progress goes to stderr; stdout carries only the binaries' directory.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
go=$("$here/../../scripts/ensure-go.sh")
if [ -n "${AIRLOCK_KUBE_CACHE:-}" ]; then
	cache=$AIRLOCK_KUBE_CACHE
elif [ "$(id -u)" = 0 ]; then
	cache=/var/cache/airlock/kube
else
	cache=$HOME/.cache/airlock/kube
fi
key=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
out=$cache/$key
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-scheduler" ] && [ -x "$out/etcd" ]; then
	echo "$out"
	exit 0
fi
mkdir -p "$out.tmp"
version=$(sed -n 's/^[[:space:]]*\(require[[:space:]]*\)\{0,1\}k8s\.io\/kubernetes \(v[0-9.]*\).*$/\2/p' "$here/go.mod" | head -n 1)
[ -n "$version" ] || { echo "tools/kube: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
cd "$here"
echo "tools/kube: building the Kubernetes $version control plane; the first build takes about 10 to 20 minutes" >&2
for cmd in k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler go.etcd.io/etcd/server/v3; do
	name=$(basename "$cmd")
	[ "$name" = v3 ] && name=etcd
	echo "tools/kube: building $name" >&2
	start=$(date +%s)
	CGO_ENABLED=0 nice -n 10 "$go" build -trimpath -ldflags "$ldflags" -o "$out.tmp/$name" "$cmd" >&2
	echo "tools/kube: built $name in $(($(date +%s) - start)) s" >&2
done
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
