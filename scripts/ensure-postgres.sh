#!/bin/sh
# Make sure PostgreSQL server binaries (initdb, postgres) are installed: the PostgreSQL
# operator's tests and `make run` start a throwaway local server with them
# (controllers/postgres/localserver.py). Installs the Debian package when they are missing
# and we are root; otherwise says what to do. Quiet when there is nothing to do.
set -eu

found() {
    command -v initdb >/dev/null 2>&1 && return 0
    for dir in /usr/lib/postgresql/*/bin /usr/pgsql-*/bin; do
        [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ] && return 0
    done
    [ -n "${PG_BINDIR:-}" ] && [ -x "$PG_BINDIR/initdb" ] && return 0
    return 1
}

found && exit 0

if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL server binaries not found: install the 'postgresql' package" \
        "(or set PG_BINDIR to the directory holding initdb and postgres)" >&2
    exit 1
fi

echo "installing PostgreSQL (server binaries for the tests and make run)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq postgresql-15 >/dev/null 2>&1 \
    || apt-get install -y -qq postgresql >/dev/null
found || { echo "PostgreSQL was installed but initdb is still not found" >&2; exit 1; }
