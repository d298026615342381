# Shared by Scripts/benchmark.sh and Scripts/benchmark-stored-history.sh (sourced, not run):
# a throw-away PostgreSQL cluster for STORE=postgres. The caller sets WORK (a directory removed
# at exit), PG_DATA= (empty), and calls stop_throwaway_postgres from its cleanup.
# PG_EXTRA_OPTIONS adds server settings to the throw-away cluster, e.g.
# "-c shared_preload_libraries=pg_stat_statements" to see what each statement costs.

# --- PostgreSQL (STORE=postgres) -----------------------------------------------------------
# A throw-away cluster in $WORK/pg on a free loopback port (trust authentication, loopback only,
# gone at exit), unless POSTGRES_URL names a database.
as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
start_throwaway_postgres() {
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$bin" ] && [ -x "$bin/pg_ctl" ] || { echo "error: no PostgreSQL server; apt-get install -y postgresql, or give POSTGRES_URL" >&2; exit 2; }
    PG_BIN=$bin
    PG_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$WORK/pg"
    [ "$(id -u)" = 0 ] && chown postgres: "$WORK" "$WORK/pg"
    as_postgres "$PG_BIN/initdb" -D "$WORK/pg/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
    PG_DATA="$WORK/pg/data"
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$WORK/pg/server.log" -w -t 60 \
        -o "-p $PG_PORT -k $WORK/pg -c listen_addresses=127.0.0.1 -c max_connections=200 ${PG_EXTRA_OPTIONS:-}" start >/dev/null
    STORE="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
}
stop_throwaway_postgres() {
    if [ -n "$PG_DATA" ] && [ -f "$PG_DATA/postmaster.pid" ]; then
        as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null 2>&1 || true
    fi
}
# CPU ticks (user + system) of every process of the throw-away cluster: the postmaster and its
# children (backends, WAL writer, checkpointer), those that exited included (a process's ticks
# vanish from /proc with it; without its parent's count, a run in which an autovacuum worker ended
# once printed -37% of a core). "n/a" for a database given by POSTGRES_URL.
postgres_ticks() {
    if [ -z "$PG_DATA" ] || [ ! -f "$PG_DATA/postmaster.pid" ]; then echo n/a; return; fi
    local master
    master=$(head -n 1 "$PG_DATA/postmaster.pid")
    # The postmaster's own CPU and its reaped children's (fields 16 and 17: a backend or an
    # autovacuum worker that exited during the run), then each living child's (one that exits in
    # the few milliseconds between the two reads is counted in neither, all its CPU lost).
    {
        awk '{print $14 + $15 + $16 + $17}' "/proc/$master/stat" 2>/dev/null || true
        { ps -o pid= --ppid "$master" || true; } | while read -r pid; do
            awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || true
        done
    } | awk '{ total += $1 } END { print total + 0 }'
}
