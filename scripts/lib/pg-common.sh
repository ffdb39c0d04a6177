# Shell functions shared by the throwaway-server scripts (postgres.sh,
# pg-replica.sh, pgbouncer.sh). Sourced, not run: the sourcing script defines
# say() for the messages.

# Runs a server binary as the postgres user when we are root (PostgreSQL and
# PgBouncer refuse to run as root).
as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# The directory holding PROGRAM: the newest /usr/lib/postgresql/*/bin that has
# it (Debian's layout), else where PATH finds it.
pg_bindir_of() {
    local program="$1" d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/$program" ] && { echo "$d"; return 0; }
    done
    command -v "$program" >/dev/null 2>&1 && { dirname "$(command -v "$program")"; return 0; }
    return 1
}

# The port a postgresql:// URL names (5432 when it names none).
url_port() {
    local hostport="${1#*://}"
    hostport="${hostport#*@}"
    hostport="${hostport%%/*}"
    hostport="${hostport%%\?*}"
    case "$hostport" in *:*) echo "${hostport##*:}" ;; *) echo 5432 ;; esac
}

# Installs Debian's PACKAGE (NAME in the messages) with apt-get, quietly, as
# root; apt-get update only when the first try fails. The package's
# post-install would start a server of its own (we do not use it): a
# policy-rc.d keeps it from starting.
apt_install_server() {
    local package="$1" name="$2"
    if [ "$(id -u)" != 0 ]; then
        say "$name is not installed and we are not root: run 'apt-get install -y $package' first"
        exit 1
    fi
    say "installing Debian's $package package"
    export DEBIAN_FRONTEND=noninteractive
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    (apt-get install -y --no-install-recommends "$package" >/dev/null 2>&1 ||
        { apt-get update >/dev/null && apt-get install -y --no-install-recommends "$package" >/dev/null; }) ||
        { rm -f /usr/sbin/policy-rc.d; say "apt-get install $package failed"; exit 1; }
    rm -f /usr/sbin/policy-rc.d
}

# Stops the server of the data directory DATA with BIN/pg_ctl (fast shutdown)
# when it runs; says so unless the third argument is "quiet".
pg_ctl_stop() {
    local bin="$1" data="$2"
    if [ -f "$data/postmaster.pid" ]; then
        as_pg "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
        [ "${3:-}" = quiet ] || say "stopped"
    fi
}
