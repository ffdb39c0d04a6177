#!/usr/bin/env bash
# A throwaway PgBouncer on loopback in front of a PostgreSQL server, for the
# test commands: what most production deployments put between the hosts and
# the database.
#
#   scripts/pgbouncer.sh run -- CMD...   install if missing, start, run CMD with
#                                        IDEMPOTENCY_PG_URL pointing at the
#                                        bouncer, stop (always)
#   scripts/pgbouncer.sh start | stop | url | reload
#
# The upstream is the server of IDEMPOTENCY_PG_URL (so it nests inside
# `scripts/postgres.sh run -- ...`), or PGB_UPSTREAM_PORT on 127.0.0.1.
# The bouncer is Debian's `pgbouncer` package (installed with apt-get when
# missing), run as the `postgres` user when we are root (PgBouncer refuses to
# run as root), with its configuration in a fresh directory under /tmp.
# Settings:
#   PGB_PORT   listen port (default 25433; below the ephemeral range, as
#              postgres.sh's 25432)
#   PGB_MODE   pool_mode: transaction (default) or session
#   PGB_AUTH   trust (default; any role of the server, looked up through
#              auth_query as the throwaway server trusts loopback) or md5
#              (clients must give PGB_PASSWORD, default "bouncer", as the
#              `postgres` role: checks that the hosts authenticate through it)
#   PGB_POOL_SIZE  server connections per database and role (transaction
#              mode: default 4, fewer than the hosts' pools, so clients share
#              server connections; session mode: default 60, one per client)
#   PGB_DIR    default /tmp/idempotency-ledger-pgbouncer-$PGB_PORT
#
# `server_round_robin = 1`: consecutive transactions of one client go to
# different server connections. With PgBouncer's default (the last one
# used), a lone client keeps one server connection and session state
# (prepared statements, SET) seems to survive: tests would pass by luck.
#
# TLS for clients with the upstream's throwaway certificate (the same CA,
# IDEMPOTENCY_PG_CA, verifies it); plain connections are accepted too
# (client_tls_sslmode = allow), as the throwaway server does.
#
# `run` also exports IDEMPOTENCY_PG_DIRECT_URL (the server itself, for what
# must not go through a pooler: pg_ctl, pg_terminate_backend, the harness's
# own checks) and IDEMPOTENCY_PG_POOLER (the pool mode). A transaction pooler
# cannot carry a per-connection search_path (PgBouncer 1.18 refuses the
# `options` startup parameter, and a SET would not outlive its transaction):
# the suites then give each test schema a role of its own whose search_path
# is that schema (PgBouncer pools per database and role).
set -euo pipefail

PGB_PORT="${PGB_PORT:-25433}"
PGB_MODE="${PGB_MODE:-transaction}"
PGB_AUTH="${PGB_AUTH:-trust}"
PGB_PASSWORD="${PGB_PASSWORD:-bouncer}"
# Session mode holds a server connection per client connection for its
# whole life: the pool must be as large as the clients' pools together (a
# client beyond it waits for query_wait_timeout, 120 s, inside its query).
if [ "$PGB_MODE" = session ]; then PGB_POOL_SIZE="${PGB_POOL_SIZE:-60}"; else PGB_POOL_SIZE="${PGB_POOL_SIZE:-4}"; fi
PGB_DIR="${PGB_DIR:-/tmp/idempotency-ledger-pgbouncer-$PGB_PORT}"

say() { echo "pgbouncer.sh: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib/pg-common.sh"

case "$PGB_MODE" in transaction | session) ;; *) say "PGB_MODE must be transaction or session"; exit 2 ;; esac
case "$PGB_AUTH" in trust | md5) ;; *) say "PGB_AUTH must be trust or md5"; exit 2 ;; esac

# The upstream server: host, port and the directory of its certificate.
upstream_port() {
    if [ -n "${PGB_UPSTREAM_PORT:-}" ]; then echo "$PGB_UPSTREAM_PORT"; return; fi
    local url="${IDEMPOTENCY_PG_DIRECT_URL:-${IDEMPOTENCY_PG_URL:-}}"
    [ -n "$url" ] || { say "no upstream: set IDEMPOTENCY_PG_URL (scripts/postgres.sh run -- $0 run -- ...) or PGB_UPSTREAM_PORT"; exit 2; }
    url_port "$url"
}

url() {
    if [ "$PGB_AUTH" = md5 ]; then
        echo "postgresql://postgres:$PGB_PASSWORD@127.0.0.1:$PGB_PORT/postgres"
    else
        echo "postgresql://postgres@127.0.0.1:$PGB_PORT/postgres"
    fi
}

ensure_installed() {
    command -v pgbouncer >/dev/null 2>&1 && return 0
    [ -x /usr/sbin/pgbouncer ] && return 0
    apt_install_server pgbouncer PgBouncer
}

bouncer_bin() { command -v pgbouncer 2>/dev/null || echo /usr/sbin/pgbouncer; }

# md5 of password + user, as pg_authid stores it.
md5_secret() { printf 'md5%s' "$(printf '%s%s' "$PGB_PASSWORD" postgres | md5sum | cut -d' ' -f1)"; }

write_config() {
    local up="$1" certdir="$2"
    {
        echo "[databases]"
        # Any database name the client asks for, on the upstream server.
        echo "* = host=127.0.0.1 port=$up"
        echo
        echo "[pgbouncer]"
        echo "listen_addr = 127.0.0.1"
        echo "listen_port = $PGB_PORT"
        echo "unix_socket_dir ="
        echo "pool_mode = $PGB_MODE"
        echo "default_pool_size = $PGB_POOL_SIZE"
        echo "max_client_conn = 2000"
        # The suites give each test schema a role (a pool of its own): cap the
        # server connections per database below the throwaway server's 200,
        # and close idle ones soon (PgBouncer evicts an idle connection of
        # another pool when the cap is reached).
        echo "max_db_connections = ${PGB_MAX_DB_CONNECTIONS:-80}"
        echo "server_idle_timeout = 10"
        echo "server_round_robin = 1"
        echo "auth_type = $PGB_AUTH"
        echo "auth_file = $PGB_DIR/userlist.txt"
        # Roles not in auth_file are looked up on the server (the suites'
        # per-schema roles); the throwaway server trusts loopback.
        echo "auth_user = postgres"
        echo "admin_users = postgres"
        echo "stats_users = postgres"
        echo "logfile = $PGB_DIR/pgbouncer.log"
        echo "pidfile = $PGB_DIR/pgbouncer.pid"
        echo "log_connections = 0"
        echo "log_disconnections = 0"
        # A server connection that failed over or was terminated is
        # replaced quickly (defaults: 15 s and 30 s).
        echo "server_login_retry = 1"
        echo "server_connect_timeout = 5"
        if [ -n "$certdir" ] && [ -f "$certdir/server.crt" ]; then
            echo "client_tls_sslmode = allow"
            echo "client_tls_cert_file = $certdir/server.crt"
            echo "client_tls_key_file = $certdir/server.key"
            echo "client_tls_ca_file = $certdir/ca.pem"
        fi
    } >"$PGB_DIR/pgbouncer.ini"
    if [ "$PGB_AUTH" = md5 ]; then
        printf '"postgres" "%s"\n' "$(md5_secret)" >"$PGB_DIR/userlist.txt"
    else
        printf '"postgres" ""\n' >"$PGB_DIR/userlist.txt"
    fi
}

start() {
    ensure_installed
    local up certdir
    up="$(upstream_port)"
    # postgres.sh keeps the certificate beside IDEMPOTENCY_PG_CA.
    certdir=""
    if [ -n "${IDEMPOTENCY_PG_CA:-}" ]; then certdir="$(dirname "$IDEMPOTENCY_PG_CA")"; fi
    stop quiet
    rm -rf "$PGB_DIR"
    mkdir -p "$PGB_DIR"
    write_config "$up" "$certdir"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$PGB_DIR"
    as_pg "$(bouncer_bin)" -d "$PGB_DIR/pgbouncer.ini" >"$PGB_DIR/start.log" 2>&1 ||
        { cat "$PGB_DIR/start.log" "$PGB_DIR/pgbouncer.log" >&2 2>/dev/null; exit 1; }
    local i
    for i in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$PGB_PORT") 2>/dev/null && break
        sleep 0.1
    done
    [ "$i" -lt 100 ] || { say "PgBouncer did not listen on $PGB_PORT"; cat "$PGB_DIR/pgbouncer.log" >&2; exit 1; }
    say "$("$(bouncer_bin)" --version | head -1) on 127.0.0.1:$PGB_PORT, pool_mode $PGB_MODE, auth $PGB_AUTH, in front of 127.0.0.1:$up ($PGB_DIR)"
    url
}

# Re-reads the configuration (after PGB_UPSTREAM_PORT changed: the new
# upstream for new server connections, as a managed endpoint switches).
reload() {
    local up certdir=""
    up="$(upstream_port)"
    if [ -n "${IDEMPOTENCY_PG_CA:-}" ]; then certdir="$(dirname "$IDEMPOTENCY_PG_CA")"; fi
    write_config "$up" "$certdir"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$PGB_DIR"
    kill -HUP "$(cat "$PGB_DIR/pgbouncer.pid")"
    say "reloaded: upstream 127.0.0.1:$up"
}

stop() {
    local pid
    if [ -f "$PGB_DIR/pgbouncer.pid" ]; then
        pid="$(cat "$PGB_DIR/pgbouncer.pid" 2>/dev/null || true)"
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -INT "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
            [ "${1:-}" = quiet ] || say "stopped"
        fi
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) url ;;
    reload) reload ;;
    run)
        shift
        [ "${1:-}" = "--" ] && shift
        [ $# -gt 0 ] || { say "usage: $0 run -- CMD..."; exit 2; }
        direct="${IDEMPOTENCY_PG_DIRECT_URL:-${IDEMPOTENCY_PG_URL:-postgresql://postgres@127.0.0.1:$(upstream_port)/postgres}}"
        start >/dev/null
        trap 'stop' EXIT
        IDEMPOTENCY_PG_URL="$(url)" IDEMPOTENCY_PG_DIRECT_URL="$direct" IDEMPOTENCY_PG_POOLER="$PGB_MODE" "$@"
        ;;
    *)
        echo "usage: $0 run -- CMD... | start | stop | url | reload" >&2
        exit 2
        ;;
esac
