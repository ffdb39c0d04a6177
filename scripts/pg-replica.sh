#!/usr/bin/env bash
# A second throwaway PostgreSQL server as a streaming replica of the first
# (scripts/postgres.sh's), for the failover probe (faults/failover.py).
#
#   scripts/pg-replica.sh run -- CMD...   pg_basebackup from the primary, start the
#                                         replica, run CMD with IDEMPOTENCY_PG_REPLICA_URL
#                                         and IDEMPOTENCY_PG_REPLICA_DIR set, stop (always)
#   scripts/pg-replica.sh start | stop | promote | url | sync on|off
#
# The primary is the server of IDEMPOTENCY_PG_URL (so it nests inside
# `scripts/postgres.sh run -- ...`), or PG_PRIMARY_PORT on 127.0.0.1, with its
# data in PG_PRIMARY_DIR (default postgres.sh's /tmp/idempotency-ledger-pg-$port).
# The throwaway server trusts loopback for replication connections, and
# PostgreSQL 15's defaults (wal_level replica, max_wal_senders 10) suffice.
# Settings:
#   REPLICA_PORT  default 25436
#   REPLICA_DIR   default /tmp/idempotency-ledger-pg-$REPLICA_PORT
#   SYNC          on (default): the primary's synchronous_standby_names names
#                 the replica, so a COMMIT returns once the replica has flushed
#                 it (synchronous_commit = on); off: asynchronous streaming.
#
# The replica's copy of postgresql.auto.conf gets synchronous_standby_names
# = '' (a promoted replica has no standby of its own: commits would wait
# forever) and a primary_conninfo naming it `idempotency_replica`. It
# serves TLS with the primary's throwaway certificate (same CA).
set -euo pipefail

REPLICA_PORT="${REPLICA_PORT:-25436}"
REPLICA_DIR="${REPLICA_DIR:-/tmp/idempotency-ledger-pg-$REPLICA_PORT}"
SYNC="${SYNC:-on}"
NAME=idempotency_replica

say() { echo "pg-replica.sh: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib/pg-common.sh"

primary_port() {
    if [ -n "${PG_PRIMARY_PORT:-}" ]; then echo "$PG_PRIMARY_PORT"; return; fi
    local url="${IDEMPOTENCY_PG_DIRECT_URL:-${IDEMPOTENCY_PG_URL:-}}"
    [ -n "$url" ] || { say "no primary: set IDEMPOTENCY_PG_URL (scripts/postgres.sh run -- $0 run -- ...) or PG_PRIMARY_PORT"; exit 2; }
    url_port "$url"
}

primary_dir() { echo "${PG_PRIMARY_DIR:-/tmp/idempotency-ledger-pg-$(primary_port)}"; }

find_bindir() {
    pg_bindir_of pg_basebackup && return 0
    say "pg_basebackup not found (scripts/postgres.sh installs Debian's postgresql package)"
    return 1
}

url() { echo "postgresql://postgres@127.0.0.1:$REPLICA_PORT/postgres"; }

psql_on() {
    local port="$1"
    shift
    as_pg "$(find_bindir)/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"
}

# Sets the primary's synchronous_standby_names and waits until the replica
# streams in that mode.
set_sync() {
    local mode="$1" p want state i
    p="$(primary_port)"
    case "$mode" in
        on) psql_on "$p" -c "ALTER SYSTEM SET synchronous_standby_names = '$NAME'" -c "SELECT pg_reload_conf()" >/dev/null; want=sync ;;
        off) psql_on "$p" -c "ALTER SYSTEM RESET synchronous_standby_names" -c "SELECT pg_reload_conf()" >/dev/null; want=async ;;
        *) say "sync: on or off"; exit 2 ;;
    esac
    for i in $(seq 1 300); do
        state="$(psql_on "$p" -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = '$NAME' AND state = 'streaming'" || true)"
        [ "$state" = "$want" ] && { say "replication is $want"; return 0; }
        sleep 0.1
    done
    say "the replica did not reach $want streaming (state: '${state:-none}')"
    exit 1
}

start() {
    local bin p pdir
    bin="$(find_bindir)"
    p="$(primary_port)"
    pdir="$(primary_dir)"
    stop quiet
    rm -rf "$REPLICA_DIR"
    mkdir -p "$REPLICA_DIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$REPLICA_DIR"
    as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$p" -U postgres -D "$REPLICA_DIR/data" -X stream -c fast -R >"$REPLICA_DIR/basebackup.log" 2>&1 ||
        { cat "$REPLICA_DIR/basebackup.log" >&2; exit 1; }
    # Later lines win in postgresql.auto.conf.
    as_pg sh -c "cat >>'$REPLICA_DIR/data/postgresql.auto.conf'" <<EOF
primary_conninfo = 'host=127.0.0.1 port=$p user=postgres application_name=$NAME'
synchronous_standby_names = ''
EOF
    local tls=""
    if [ -f "$pdir/server.crt" ]; then
        tls="-c ssl=on -c ssl_cert_file=$pdir/server.crt -c ssl_key_file=$pdir/server.key"
    fi
    as_pg "$bin/pg_ctl" -D "$REPLICA_DIR/data" -l "$REPLICA_DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $REPLICA_PORT -k $REPLICA_DIR -c max_connections=200 -c hot_standby=on $tls" start >/dev/null ||
        { cat "$REPLICA_DIR/server.log" >&2; exit 1; }
    "$bin/pg_isready" -h 127.0.0.1 -p "$REPLICA_PORT" -t 30 >/dev/null
    set_sync "$SYNC"
    say "replica of 127.0.0.1:$p on 127.0.0.1:$REPLICA_PORT ($REPLICA_DIR), synchronous $SYNC"
    url
}

promote() {
    as_pg "$(find_bindir)/pg_ctl" -D "$REPLICA_DIR/data" -w -t 60 promote >/dev/null
    say "promoted 127.0.0.1:$REPLICA_PORT"
}

stop() {
    local bin
    bin="$(find_bindir 2>/dev/null)" || return 0
    pg_ctl_stop "$bin" "$REPLICA_DIR/data" "${1:-}"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    promote) promote ;;
    url) url ;;
    sync) set_sync "${2:-}" ;;
    run)
        shift
        [ "${1:-}" = "--" ] && shift
        [ $# -gt 0 ] || { say "usage: $0 run -- CMD..."; exit 2; }
        start >/dev/null
        trap 'stop' EXIT
        IDEMPOTENCY_PG_REPLICA_URL="$(url)" IDEMPOTENCY_PG_REPLICA_DIR="$REPLICA_DIR" "$@"
        ;;
    *)
        echo "usage: $0 run -- CMD... | start | stop | promote | url | sync on|off" >&2
        exit 2
        ;;
esac
