#!/bin/sh
# errcheck.sh ERRCHECK: runs errcheck (the binary given) over the module's
# non-test code for `make vet` and fails on a dropped error that neither
# tools/lint/errcheck.exclude (calls whose error is never needed, by name)
# nor tools/lint/errcheck.baseline (the drops found when the check came in,
# by file and call, still to be handled) accepts. Tests are left out: a
# test fails on what it asserts. A baseline entry that is no longer found
# is named, so that the list only shrinks.
set -eu
export LC_ALL=C
cd "$(dirname "$0")/.."
lint=tools/lint
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
"$1" -ignoretests -exclude "$lint/errcheck.exclude" ./... >"$tmp/out" || rc=$?
# errcheck exits 1 when it finds dropped errors, 2 or more when it fails.
if [ "$rc" -gt 1 ]; then
	cat "$tmp/out" >&2
	exit "$rc"
fi
# file:line:col:<tab>call -> file:<tab>call, so that an entry outlives edits
# that only move it.
sed 's/^\([^:]*\):[0-9]*:[0-9]*:/\1:/' "$tmp/out" | sort -u >"$tmp/found"
grep -v '^#' "$lint/errcheck.baseline" | grep -v '^$' | sort -u >"$tmp/baseline"
comm -23 "$tmp/baseline" "$tmp/found" | sed 's/^/errcheck: no longer found, remove from tools\/lint\/errcheck.baseline: /' >&2
comm -13 "$tmp/baseline" "$tmp/found" >"$tmp/new"
if [ -s "$tmp/new" ]; then
	echo "errcheck: errors dropped (handle them, or see docs/testing.md for an exception):" >&2
	awk 'NR == FNR { new[$0]; next } { k = $0; sub(/:[0-9]+:[0-9]+:/, ":", k); if (k in new) print }' "$tmp/new" "$tmp/out" >&2
	exit 1
fi
