#!/bin/sh
# Prints the path of a Go toolchain new enough for this module, installing
# one first when there is none. Debian 12 ships an older Go (1.19), so
# this installs Debian's golang-go and uses it to fetch the toolchain named
# in go.mod through the Go module proxy (the golang.org/toolchain module),
# into /usr/local/lib/airlock-go. Progress goes to stderr; stdout carries
# only the path. Also installs gcc, which the race detector needs.
set -eu
cd "$(dirname "$0")/.."
want=$(sed -n 's/^go \([0-9][0-9.]*\)$/\1/p' go.mod)
want_minor=$(echo "$want" | cut -d. -f2)
want_patch=$(echo "$want" | cut -d. -f3)
want_patch=${want_patch:-0}

# version_of prints a toolchain's "minor patch" (go1.26.8 -> "26 8").
version_of() { "$1" env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p'; }

new_enough() {
	[ -x "$1" ] || return 1
	v=$(version_of "$1")
	[ -n "$v" ] || return 1
	m=${v% *}
	p=${v#* }
	p=${p:-0}
	[ "$m" -gt "$want_minor" ] || { [ "$m" -eq "$want_minor" ] && [ "$p" -ge "$want_patch" ]; }
}

apt_install() {
	if [ "$(id -u)" != 0 ]; then
		echo "ensure-go: install $* (as root: apt-get install $*)" >&2
		exit 2
	fi
	echo "ensure-go: installing $*" >&2
	apt-get install -y -q --no-install-recommends "$@" >&2 ||
		{ apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "$@" >&2; }
}

command -v gcc >/dev/null 2>&1 || apt_install gcc libc6-dev

for g in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go /usr/local/lib/airlock-go/bin/go; do
	if [ -n "$g" ] && new_enough "$g"; then
		echo "$g"
		exit 0
	fi
done

# Bootstrap: any Go that can download modules fetches the wanted toolchain.
boot=$(command -v go 2>/dev/null || true)
if [ -z "$boot" ]; then
	apt_install golang-go ca-certificates
	boot=/usr/bin/go
fi
ver=$(echo "$want" | awk -F. '{ if (NF == 2) print $0 ".0"; else print $0 }')
mod="golang.org/toolchain@v0.0.1-go${ver}.linux-$(dpkg --print-architecture)"
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
echo "ensure-go: fetching Go $ver ($mod)" >&2
# Outside any module, so that this repo's go.mod does not bind the old Go.
dir=$(cd "$tmp" && GOPATH="$tmp" GOMODCACHE="$tmp/mod" GOFLAGS=-mod=mod GOTOOLCHAIN=local \
	"$boot" mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] && [ -f "$dir/bin/go" ] || { echo "ensure-go: download of $mod failed" >&2; exit 1; }
rm -rf /usr/local/lib/airlock-go.new
cp -a "$dir" /usr/local/lib/airlock-go.new
chmod -R u+w /usr/local/lib/airlock-go.new
# The toolchain module's files are not executable in the module cache.
chmod +x /usr/local/lib/airlock-go.new/bin/* /usr/local/lib/airlock-go.new/pkg/tool/*/* 2>/dev/null || true
rm -rf /usr/local/lib/airlock-go
mv /usr/local/lib/airlock-go.new /usr/local/lib/airlock-go
echo /usr/local/lib/airlock-go/bin/go
