"""The postgres container's entrypoint: a supervisor that runs PostgreSQL as the agent says
(:mod:`controllers.postgres.standing` has the rules; this is their hands).

It needs only bash and PostgreSQL's own programs (``initdb``, ``postgres``, ``pg_ctl``,
``pg_basebackup``, ``pg_rewind``, ``pg_controldata``, ``psql``), which the official image and
the local node's image have; it runs as the image's ``postgres`` user.

Every 0.2 s (sooner when the agent writes to the ``wake`` pipe) it reads the agent's
``desired`` file and:

- **watchdog**: stops a primary at once (``SIGQUIT``, immediate shutdown: no commit after it)
  when its lease ran out. The lease arrives as a remaining duration and is measured on this
  process's clock (``/proc/uptime``), so the two containers' clocks need not agree;
- stops a primary no longer wanted (fast shutdown: connected standbys receive every WAL record
  before the server exits, so a switchover loses nothing), then records whether the data
  directory was shut down cleanly and its last checkpoint (the final position the operator
  compares standbys against);
- starts PostgreSQL as primary only under a grant newer than the last one it used and a valid
  lease (an empty volume: ``initdb`` and the ``replicator`` role first); promotes a standby
  the same way (``pg_ctl promote``);
- starts a standby streaming from the upstream it is given (an empty volume:
  ``pg_basebackup`` first); re-points a running standby with ``ALTER SYSTEM`` and a reload;
  rewinds (``pg_rewind``) a former primary before it follows, and a standby when asked or
  when it keeps failing to start (a clean shutdown or single-user crash recovery first;
  after three failed rewinds, a new clone). Both only against an upstream that answers as
  primary, and a clone replaces the data directory only once it is complete: a member never
  loses its WAL to a primary that is not there;
- applies the ``synchronous_standby_names`` override of a DegradeToAsync primary;
- on SIGTERM/SIGINT (the Pod is deleted): a primary keeps serving while the agent still wants
  it primary, up to ``CRPY_TERM_WAIT`` seconds (default 30), so the operator can switch over
  to a standby first (not at all for a lone instance: nobody can take over); then a fast
  shutdown, and exit.

It writes its ``state`` (mode, whether PostgreSQL runs, what the data directory holds, a clean
stop's final LSN, why PostgreSQL last stopped) on every change and once a second, and a
``heartbeat`` the liveness probe reads. A PostgreSQL that exits unexpectedly is restarted per
the agent's word, after a backoff of 1 s doubling to 30 s.

Environment: ``PGDATA`` (required), ``CRPY_RUN`` (the shared directory, default
``/run/crpy-ha``), ``CRPY_CONFIG_DIR`` (``postgresql.conf`` and ``pg_hba.conf``, default
``/etc/postgres``), ``CRPY_SOCKET_DIR`` (default ``/var/run/postgresql``), ``PGPORT`` (5432),
``CRPY_MEMBER`` (the member's name, default ``$HOSTNAME``), ``POSTGRES_USER``,
``POSTGRES_PASSWORD``, ``REPLICATION_PASSWORD``, ``POSTGRES_INITDB_ARGS``.
"""

from __future__ import annotations

SCRIPT = r"""#!/bin/bash
# The PostgreSQL supervisor (rendered by the postgres operator): see
# controllers/postgres/supervisor.py in the operator's sources for what it guarantees.
set -uo pipefail
: "${PGDATA:?PGDATA must be set}"
RUN=${CRPY_RUN:-/run/crpy-ha}
CONF=${CRPY_CONFIG_DIR:-/etc/postgres}
SOCK=${CRPY_SOCKET_DIR:-/var/run/postgresql}
PORT=${PGPORT:-5432}
ME=${CRPY_MEMBER:-${HOSTNAME:-member}}
SUPERUSER=${POSTGRES_USER:-postgres}
TERM_WAIT_CS=$(( ${CRPY_TERM_WAIT:-30} * 100 ))
REPLICATION_USER=${CRPY_REPLICATION_USER:-replicator}
export PGHOST=$SOCK PGPORT=$PORT PGUSER=$SUPERUSER PGDATABASE=postgres PGCONNECT_TIMEOUT=3
unset PGPASSWORD
umask 0077

log() { printf '%(%Y-%m-%dT%H:%M:%S)T supervisor: %s\n' -1 "$*" >&2; }
tick() { local up; read -r up _ < /proc/uptime; up=${up/./}; NOW=$((10#$up)); }

pg_pid=""        # the postmaster, our child
mode=none        # what PostgreSQL runs as: primary, standby, none
grant_used=-1    # the last grant acted on (-1: not read yet)
rewinds_done=-1
stopping=""      # why we are stopping it: request, lease, terminate
stopped_by=""    # why it last stopped: crash, lease, request
stop_cs=0
started_cs=0
failures=0       # unexpected exits in a row
retry_at=0
rewind_failures=0
terminating=0
term_cs=0
lease_deadline=0 # centiseconds of our clock; -1 unbounded; 0 none
last_seq=""
d_mode=standby d_upstream="" d_grant=0 d_sync=- d_rewind=0 d_hold=1
applied_upstream="?" applied_sync="?"
cd_state="" cd_lsn="" cd_tli=0
error=""
last_state="" state_cs=0 beat_cs=0

mkdir -p "$RUN"
[ -p "$RUN/wake" ] || mkfifo -m 0600 "$RUN/wake"
exec 3<>"$RUN/wake"
{
  printf '*:*:*:%s:%s\n' "$REPLICATION_USER" "${REPLICATION_PASSWORD:-}"
  printf '*:*:*:%s:%s\n' "$SUPERUSER" "${POSTGRES_PASSWORD:-}"
} > "$RUN/pgpass"
chmod 0600 "$RUN/pgpass"

on_stop_signal() {
  [ "$terminating" = 1 ] && return
  terminating=1; tick; term_cs=$NOW; log "asked to stop"
}
trap on_stop_signal TERM INT

kind_of() {  # what the data directory holds, into KIND
  if [ ! -s "$PGDATA/PG_VERSION" ]; then KIND=empty
  elif [ -e "$PGDATA/standby.signal" ]; then KIND=standby
  else KIND=primary; fi
}

running() {
  [ -n "$pg_pid" ] || return 1
  local st=""
  { read -r _ _ st _ < "/proc/$pg_pid/stat"; } 2>/dev/null || return 1
  [ "$st" != Z ]
}

controldata() {
  cd_state="" cd_lsn="" cd_tli=0
  [ -s "$PGDATA/PG_VERSION" ] || return 0
  local line
  while IFS= read -r line; do
    case $line in
      "Database cluster state:"*) cd_state=${line#*:}; cd_state=${cd_state#"${cd_state%%[! ]*}"} ;;
      "Latest checkpoint location:"*) cd_lsn=${line##* } ;;
      "Latest checkpoint's TimeLineID:"*) cd_tli=${line##* } ;;
    esac
  done < <(LC_ALL=C pg_controldata -D "$PGDATA" 2>/dev/null)
}

clean() { [ "$cd_state" = "shut down" ] || [ "$cd_state" = "shut down in recovery" ]; }

read_desired() {
  [ -s "$RUN/desired" ] || return 0
  local k v seq="" lease=0
  while IFS='=' read -r k v; do
    case $k in
      seq) seq=$v ;; mode) d_mode=$v ;; upstream) d_upstream=$v ;; grant) d_grant=$v ;;
      lease_cs) lease=$v ;; sync) d_sync=$v ;; rewind) d_rewind=$v ;; hold) d_hold=$v ;;
    esac
  done < "$RUN/desired"
  if [ "$seq" != "$last_seq" ]; then
    last_seq=$seq
    if [ "$lease" = -1 ]; then lease_deadline=-1
    elif [ "$lease" -gt 0 ] 2>/dev/null; then lease_deadline=$(( NOW + lease ))
    else lease_deadline=0; fi
  fi
  # What was granted before this process started was granted to another one.
  if [ "$grant_used" = -1 ]; then grant_used=$d_grant; rewinds_done=$d_rewind; fi
}

lease_ok() { [ "$lease_deadline" = -1 ] || [ "$NOW" -lt "$lease_deadline" ]; }

write_state() {
  local running_flag=0 clean_flag=0 final="" tli=0 since=0
  running && running_flag=1
  kind_of
  if [ "$running_flag" = 0 ] && clean; then clean_flag=1; final=$cd_lsn; tli=$cd_tli; fi
  [ -n "$stopped_by" ] && since=$(( NOW - stop_cs ))
  local text="mode=$mode
running=$running_flag
data=$KIND
clean=$clean_flag
final=$final
final_tli=$tli
grant=$grant_used
stopped_by=$stopped_by
terminating=$terminating
phase=$1
error=$error
"
  if [ "$text" != "$last_state" ] || [ $(( NOW - state_cs )) -ge 100 ]; then
    printf '%sstopped_for_cs=%s\n' "$text" "$since" > "$RUN/.state.tmp" \
      && mv -f "$RUN/.state.tmp" "$RUN/state"
    last_state=$text state_cs=$NOW
  fi
}

conninfo() {  # $1: "host port" of the upstream
  local host=${1%% *} port=${1##* }
  printf 'host=%s port=%s user=%s passfile=%s application_name=%s connect_timeout=5' \
    "$host" "$port" "$REPLICATION_USER" "$RUN/pgpass" "$ME"
  printf ' keepalives_idle=5 keepalives_interval=2 keepalives_count=3'
}

set_conninfo_file() {  # PostgreSQL is down: edit postgresql.auto.conf directly
  local auto="$PGDATA/postgresql.auto.conf" kept=""
  if [ -f "$auto" ]; then
    kept=$(grep -v -E \
      '^[[:space:]]*(primary_conninfo|primary_slot_name|synchronous_standby_names)[[:space:]]*=' \
      "$auto")
  fi
  {
    [ -n "$kept" ] && printf '%s\n' "$kept"
    [ -n "$1" ] && printf "primary_conninfo = '%s'\n" "$(conninfo "$1")"
  } > "$auto.tmp" && mv -f "$auto.tmp" "$auto"
  applied_upstream=$1 applied_sync=-
}

sql() {
  timeout 10 psql -X -q -v ON_ERROR_STOP=1 -c "SET statement_timeout = 5000" "$@" >/dev/null 2>&1
}

set_conninfo_live() {
  local value=""
  [ -n "$1" ] && value=$(conninfo "$1")
  if sql -c "ALTER SYSTEM SET primary_conninfo = '$value'" -c "SELECT pg_reload_conf()"; then
    log "streaming from ${1:-nobody}"
    applied_upstream=$1
  fi
}

apply_sync() {
  local statement="ALTER SYSTEM RESET synchronous_standby_names"
  [ "$d_sync" != - ] && statement="ALTER SYSTEM SET synchronous_standby_names = '$d_sync'"
  if sql -c "$statement" -c "SELECT pg_reload_conf()"; then
    if [ "$d_sync" = - ]; then log "synchronous_standby_names: as configured"
    else log "synchronous_standby_names: '$d_sync' (degraded: too few standbys stream)"; fi
    applied_sync=$d_sync
  fi
}

start_postgres() {  # $1: primary or standby
  mode=$1
  stopped_by="" stopping=""
  write_state starting
  postgres -D "$PGDATA" -c config_file="$CONF/postgresql.conf" -c hba_file="$CONF/pg_hba.conf" \
    -c port="$PORT" -c unix_socket_directories="$SOCK" &
  pg_pid=$!
  started_cs=$NOW
  applied_sync="?"
  log "PostgreSQL started as $1 (pid $pg_pid)"
}

stop_postgres() {  # $1: INT (fast) or QUIT (immediate); $2: why
  running || return 0
  stopping=$2
  log "stopping PostgreSQL ($2, SIG$1)"
  kill -s "$1" "$pg_pid" 2>/dev/null
  local waited=0 limit=1500
  [ "$1" = QUIT ] && limit=300
  while running && [ "$waited" -lt "$limit" ]; do
    read -r -t 0.05 -u 3 _; waited=$(( waited + 5 ))
  done
  if running; then kill -s QUIT "$pg_pid" 2>/dev/null; read -r -t 2 -u 3 _; fi
  if running; then kill -s KILL "$pg_pid" 2>/dev/null; fi
  reap
}

reap() {  # PostgreSQL exited: why, and what the data directory says
  [ -n "$pg_pid" ] || return 0
  running && return 0
  wait "$pg_pid" 2>/dev/null
  local rc=$?
  tick
  pg_pid=""
  if [ -n "$stopping" ]; then stopped_by=$stopping; failures=0
  else
    stopped_by=crash
    failures=$(( failures + 1 ))
    local backoff=$(( 100 << (failures > 5 ? 5 : failures - 1) ))
    [ "$backoff" -gt 3000 ] && backoff=3000
    retry_at=$(( NOW + backoff ))
    error="PostgreSQL exited with status $rc"
    log "$error"
  fi
  stopping="" stop_cs=$NOW mode=none
  controldata
  write_state stopped
}

initialize() {
  log "initializing a new database"
  rm -rf "$PGDATA" && mkdir -p "$PGDATA" && chmod 0700 "$PGDATA" || return 1
  # shellcheck disable=SC2086
  initdb -D "$PGDATA" --username="$SUPERUSER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
    ${POSTGRES_INITDB_ARGS:-} >&2 || return 1
  postgres -D "$PGDATA" -c listen_addresses='' -c port="$PORT" -c unix_socket_directories="$SOCK" &
  local pid=$! tries=0
  until pg_isready -q || [ "$tries" -ge 100 ]; do
    read -r -t 0.1 -u 3 _; tries=$(( tries + 1 ))
  done
  psql -X -v ON_ERROR_STOP=1 -v pw="${REPLICATION_PASSWORD:-}" >/dev/null <<SQL
CREATE ROLE $REPLICATION_USER WITH REPLICATION LOGIN PASSWORD :'pw';
SQL
  local rc=$?
  kill -s INT "$pid"; wait "$pid"
  [ "$rc" = 0 ] || { error="creating the replication role failed"; return 1; }
}

clone() {  # $1: "host port"; into a new directory, swapped in only once it is complete
  local host=${1%% *} port=${1##* } fresh="$PGDATA.clone"
  log "cloning from $host:$port"
  write_state cloning
  rm -rf "$fresh" && mkdir -p "$fresh" && chmod 0700 "$fresh" || return 1
  local source="host=$host port=$port user=$REPLICATION_USER passfile=$RUN/pgpass"
  if ! pg_basebackup -D "$fresh" -X stream -c fast \
      -d "$source connect_timeout=5 application_name=$ME" >&2; then
    error="pg_basebackup from $host failed"
    rm -rf "$fresh"
    return 1
  fi
  rm -rf "$PGDATA" && mv "$fresh" "$PGDATA" || return 1
  : > "$PGDATA/standby.signal"
  set_conninfo_file "$1"
  rewind_failures=0
}

make_clean() {  # crash recovery without serving anyone (single-user mode)
  controldata
  clean && return 0
  log "crash recovery before rewinding (state: $cd_state)"
  write_state recovering
  rm -f "$PGDATA/standby.signal" "$PGDATA/recovery.signal"
  postgres --single -D "$PGDATA" -c config_file="$CONF/postgresql.conf" \
    -c hba_file="$CONF/pg_hba.conf" -c port="$PORT" -c unix_socket_directories="$SOCK" \
    postgres < /dev/null > /dev/null
  controldata
  clean
}

rewind() {  # $1: "host port" of the primary to follow
  local host=${1%% *} port=${1##* }
  if [ "$rewind_failures" -ge 3 ]; then
    log "pg_rewind failed $rewind_failures times: cloning anew"
    clone "$1"
    return
  fi
  if ! make_clean; then
    error="crash recovery failed"; rewind_failures=$(( rewind_failures + 1 )); return 1
  fi
  log "rewinding to follow $host:$port"
  write_state rewinding
  local source="host=$host port=$port user=$SUPERUSER dbname=postgres passfile=$RUN/pgpass"
  if ! pg_rewind --target-pgdata="$PGDATA" --source-server="$source connect_timeout=5" >&2; then
    rewind_failures=$(( rewind_failures + 1 ))
    error="pg_rewind from $host failed ($rewind_failures)"
    log "$error"
    return 1
  fi
  rewind_failures=0
  : > "$PGDATA/standby.signal"
  set_conninfo_file "$1"
}

upstream_primary() {  # the upstream answers as a primary
  local host=${1%% *} port=${1##* }
  [ "$(PGCONNECT_TIMEOUT=2 timeout 5 psql -X -tA \
      "host=$host port=$port user=$SUPERUSER dbname=postgres passfile=$RUN/pgpass" \
      -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]
}

step() {
  tick
  read_desired
  reap
  kind_of

  if running; then
    if [ "$mode" = primary ]; then
      # No longer wanted (a fence): a fast shutdown, so standbys receive every WAL record.
      if [ "$d_mode" != primary ]; then stop_postgres INT request; return; fi
      if ! lease_ok; then
        log "lease expired: the primary stops accepting commits"
        stop_postgres QUIT lease; return
      fi
      if [ "$terminating" = 1 ] \
          && { [ "$d_hold" = 0 ] || [ $(( NOW - term_cs )) -ge "$TERM_WAIT_CS" ]; }; then
        stop_postgres INT terminate; return
      fi
      [ "$KIND" = primary ] && [ "$d_sync" != "$applied_sync" ] && apply_sync
      write_state running
      return
    fi
    # A standby.
    if [ "$terminating" = 1 ]; then stop_postgres INT terminate; return; fi
    if [ "$d_mode" = primary ] && [ "$d_grant" -gt "$grant_used" ] && lease_ok; then
      grant_used=$d_grant mode=primary
      write_state promoting
      log "promoting (grant $d_grant)"
      pg_ctl promote -D "$PGDATA" -W >/dev/null || error="pg_ctl promote failed"
      return
    fi
    if [ "$d_rewind" -gt "$rewinds_done" ] && [ -n "$d_upstream" ]; then
      rewinds_done=$d_rewind
      # Only against a primary that answers: a rewind (or a new clone) needs it.
      if upstream_primary "$d_upstream"; then
        stop_postgres INT request
        rewind "$d_upstream" && start_postgres standby
        return
      fi
    fi
    if [ "$d_upstream" != "$applied_upstream" ] && [ $(( NOW - started_cs )) -ge 50 ]; then
      set_conninfo_live "$d_upstream"
    fi
    write_state running
    return
  fi

  # PostgreSQL is not running.
  if [ "$terminating" = 1 ]; then write_state stopped; log "stopped"; exit 0; fi
  [ "$NOW" -lt "$retry_at" ] && { write_state waiting; return; }
  case $KIND in
    empty)
      if [ "$d_mode" = primary ] && [ "$d_grant" -gt "$grant_used" ] && lease_ok; then
        grant_used=$d_grant
        if initialize; then start_postgres primary; else retry_at=$(( NOW + 500 )); fi
      elif [ -n "$d_upstream" ]; then
        if clone "$d_upstream"; then start_postgres standby; else retry_at=$(( NOW + 500 )); fi
      else
        write_state waiting
      fi ;;
    primary)
      if [ "$d_mode" = primary ] && [ "$d_grant" -gt "$grant_used" ] && lease_ok; then
        grant_used=$d_grant
        set_conninfo_file ""
        start_postgres primary
      elif [ "$d_mode" = standby ] && [ -n "$d_upstream" ] && upstream_primary "$d_upstream"; then
        if rewind "$d_upstream"; then start_postgres standby; else retry_at=$(( NOW + 500 )); fi
      else
        write_state stopped
      fi ;;
    standby)
      if [ "$failures" -ge 2 ] && [ -n "$d_upstream" ] && upstream_primary "$d_upstream"; then
        failures=0
        stop_postgres INT request
        rewind "$d_upstream" || { retry_at=$(( NOW + 500 )); return; }
      fi
      [ "$applied_upstream" != "$d_upstream" ] && set_conninfo_file "$d_upstream"
      start_postgres standby ;;
  esac
}

tick
controldata
if [ -s "$PGDATA/PG_VERSION" ] && ! clean; then stopped_by=crash stop_cs=$NOW; fi
kind_of
log "member $ME, data directory: $KIND${cd_state:+ ($cd_state)}"
while :; do
  step
  if [ $(( NOW - beat_cs )) -ge 100 ]; then
    printf '%s\n' "$NOW" > "$RUN/heartbeat"; beat_cs=$NOW
  fi
  read -r -t 0.2 -u 3 _
done
"""
