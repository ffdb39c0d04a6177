#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the test and bench commands.
#
#   scripts/postgres.sh run -- CMD...   install if missing, start, run CMD with
#                                       IDEMPOTENCY_PG_URL set, stop (always)
#   scripts/postgres.sh start | stop | url
#
# The server is Debian's `postgresql` package (installed with apt-get when no
# initdb is found), run as the `postgres` user when we are root (PostgreSQL
# refuses to run as root), with its data in a fresh directory under /tmp.
# Settings: PG_PORT (default 25432: below the kernel's ephemeral range
# 32768-60999, so no client connection can be holding it), PG_DIR (default
# /tmp/idempotency-ledger-pg-$PG_PORT).
#
# TLS is on (clients choose with sslmode): a throwaway CA signs a server
# certificate for localhost and 127.0.0.1; `run` exports the CA's file as
# IDEMPOTENCY_PG_CA for the TLS tests (sslrootcert=...).
set -euo pipefail

PG_PORT="${PG_PORT:-25432}"
PG_DIR="${PG_DIR:-/tmp/idempotency-ledger-pg-$PG_PORT}"
URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"

say() { echo "postgres.sh: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib/pg-common.sh"

find_bindir() { pg_bindir_of initdb; }

ensure_installed() {
    if find_bindir >/dev/null; then return 0; fi
    apt_install_server postgresql PostgreSQL
    find_bindir >/dev/null || { say "postgresql installed but no initdb found"; exit 1; }
}

start() {
    ensure_installed
    local bin
    bin="$(find_bindir)"
    stop quiet
    rm -rf "$PG_DIR"
    mkdir -p "$PG_DIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR"
    as_pg "$bin/initdb" -D "$PG_DIR/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 ||
        { cat "$PG_DIR/initdb.log" >&2; exit 1; }
    make_certificates
    as_pg "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c max_connections=200 -c ssl=on -c ssl_cert_file=$PG_DIR/server.crt -c ssl_key_file=$PG_DIR/server.key" start >/dev/null ||
        { cat "$PG_DIR/server.log" >&2; exit 1; }
    "$bin/pg_isready" -h 127.0.0.1 -p "$PG_PORT" -t 30 >/dev/null
    say "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT ($PG_DIR)"
    echo "$URL"
}

# A CA and a server certificate it signs (EC P-256, valid two days).
make_certificates() {
    local d="$PG_DIR"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "/CN=idempotency-ledger test CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$d/ca.key" -out "$d/ca.pem" >/dev/null 2>&1
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
        -keyout "$d/server.key" -out "$d/server.csr" >/dev/null 2>&1
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
        -extfile "$d/server.ext" -out "$d/server.crt" >/dev/null 2>&1
    chmod 600 "$d/server.key"
    [ "$(id -u)" = 0 ] && chown postgres: "$d/server.key" "$d/server.crt"
    chmod 644 "$d/ca.pem"
}

stop() {
    local bin
    bin="$(find_bindir 2>/dev/null)" || return 0
    pg_ctl_stop "$bin" "$PG_DIR/data" "${1:-}"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) echo "$URL" ;;
    run)
        shift
        [ "${1:-}" = "--" ] && shift
        [ $# -gt 0 ] || { say "usage: $0 run -- CMD..."; exit 2; }
        began=$(date +%s)
        start >/dev/null
        trap 'stop' EXIT
        say "setup took $(( $(date +%s) - began )) s"
        IDEMPOTENCY_PG_URL="$URL" IDEMPOTENCY_PG_CA="$PG_DIR/ca.pem" "$@"
        ;;
    *)
        echo "usage: $0 run -- CMD... | start | stop | url" >&2
        exit 2
        ;;
esac
