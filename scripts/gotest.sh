#!/bin/sh
# gotest.sh GOTESTSUM JSONFILE GO-TEST-ARGS...: runs `go test GO-TEST-ARGS`
# through gotestsum, printing what go test prints (standard-quiet), and
# then, passed or failed, the tests that took 30 s or more, slowest first.
# It exits with go test's status. JSONFILE keeps go test's -json record.
set -u
gotestsum=$1
json=$2
shift 2
status=0
"$gotestsum" --format standard-quiet --jsonfile "$json" -- "$@" || status=$?
echo "tests that took 30 s or more, slowest first:"
"$gotestsum" tool slowest --jsonfile "$json" --threshold 30s || true
exit $status
