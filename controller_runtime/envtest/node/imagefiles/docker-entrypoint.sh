#!/usr/bin/env bash
# The entrypoint of the local node's PostgreSQL image, honouring the official postgres image's
# contract: runs the server as the postgres user (uid 999); on first start (no
# $PGDATA/PG_VERSION) runs initdb with POSTGRES_USER / POSTGRES_PASSWORD(_FILE) /
# POSTGRES_INITDB_ARGS, creates POSTGRES_DB, runs /docker-entrypoint-initdb.d/*.sh and *.sql
# against a server listening on the Unix socket only, then execs the command.
set -Eeo pipefail

if [ "${1:0:1}" = '-' ]; then
    set -- postgres "$@"
fi

if [ "$1" != 'postgres' ]; then
    exec "$@"
fi

if [ "$(id -u)" = '0' ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    POSTGRES_PASSWORD="$(< "$POSTGRES_PASSWORD_FILE")"
fi
export POSTGRES_USER="${POSTGRES_USER:-postgres}"
export POSTGRES_DB="${POSTGRES_DB:-$POSTGRES_USER}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "${POSTGRES_HOST_AUTH_METHOD:-}" != 'trust' ]; then
        echo "error: the database is uninitialized and POSTGRES_PASSWORD is not set" >&2
        echo "  set POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE) to the superuser's password" >&2
        exit 1
    fi
    mkdir -p "$PGDATA"
    chmod 0700 "$PGDATA"
    # shellcheck disable=SC2086
    initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
        ${POSTGRES_INITDB_ARGS:-}
    printf '\nhost all all all %s\n' "${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" \
        >> "$PGDATA/pg_hba.conf"
    PGUSER="$POSTGRES_USER" pg_ctl -D "$PGDATA" -w \
        -o "-c listen_addresses='' -p ${PGPORT:-5432}" start
    export PGPASSWORD="${POSTGRES_PASSWORD:-}"
    if [ "$POSTGRES_DB" != 'postgres' ]; then
        psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
            --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sh) echo "running $f"; if [ -x "$f" ]; then "$f"; else . "$f"; fi ;;
            *.sql) echo "running $f"; psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" \
                --dbname "$POSTGRES_DB" -f "$f" ;;
            *) ;;
        esac
    done
    unset PGPASSWORD
    pg_ctl -D "$PGDATA" -m fast -w stop
    echo "PostgreSQL init process complete; ready for start up."
fi

exec "$@"
