#!/bin/sh
# Installs PostgreSQL's server binaries when there are none: the store's
# conformance suite and the PostgreSQL tests make throwaway clusters with
# them (internal/testenv). Debian's package would also make and start a
# cluster of its own on port 5432; nothing of airlock's uses one, so none
# is made.
set -eu
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "ensure-postgres: install PostgreSQL (as root: apt-get install postgresql)" >&2
	exit 1
fi
mkdir -p /etc/postgresql-common
conf=/etc/postgresql-common/createcluster.conf
if ! grep -qs '^create_main_cluster' "$conf"; then
	echo 'create_main_cluster = false' >>"$conf"
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
