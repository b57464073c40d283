#!/bin/sh
# timed.sh PHASE COMMAND [ARGS...]: runs the command and then says how
# long the phase took, also when it fails, so that `make test` shows
# where its time goes.
name=$1
shift
start=$(date +%s)
"$@"
rc=$?
took=$(($(date +%s) - start))
if [ "$rc" -eq 0 ]; then
	echo "make: $name took ${took} s" >&2
else
	echo "make: $name failed after ${took} s (exit $rc)" >&2
fi
exit "$rc"
