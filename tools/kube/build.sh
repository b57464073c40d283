#!/bin/sh
# Builds kube-apiserver, kube-scheduler and etcd from the Go module proxy
# through this directory's wrapper module (see go.mod), once: they go to
# a cache directory outside the repo ($AIRLOCK_KUBE_CACHE, default
# /var/cache/airlock/kube as root, else ~/.cache/airlock/kube), named by
# the hash of go.mod and go.sum, and are reused while those stay the same.
# The first build takes about 20 minutes on 2 cores; later ones nothing.
# Progress goes to stderr; stdout carries only the binaries' directory.
#
# With --start it only starts the build in the background, niced, with
# its output in the cache's build.log, and returns at once (`make test`
# does so first, and the phases that need no control plane run
# meanwhile). One build runs at a time: a later call waits for it under
# the cache's lock, then finds the binaries (or, if it failed, builds
# them itself and shows why).
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
built() { [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-scheduler" ] && [ -x "$out/etcd" ]; }
if built; then
	[ "${1:-}" = --start ] || echo "$out"
	exit 0
fi
mkdir -p "$cache"
if [ "${1:-}" = --start ]; then
	echo "tools/kube: building the control plane in the background (log: $cache/build.log)" >&2
	setsid nohup "$0" >/dev/null 2>"$cache/build.log" </dev/null &
	exit 0
fi
exec 9>"$cache/.lock"
if ! flock -n 9; then
	echo "tools/kube: waiting for the control plane build under way (log: $cache/build.log)" >&2
	flock 9
fi
if built; then
	echo "$out"
	exit 0
fi
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
version=$(sed -n 's/^[[:space:]]*\(require[[:space:]]*\)\{0,1\}k8s\.io\/kubernetes \(v[0-9.]*\).*$/\2/p' "$here/go.mod" | head -n 1)
[ -n "$version" ] || { echo "tools/kube: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
cd "$here"
echo "tools/kube: building the Kubernetes $version control plane; the first build takes about 20 minutes on 2 cores" >&2
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
