#!/usr/bin/env bash
# Load test of POST /v1/offers/signatures over loopback with wrk.
#
# Builds the release binary (the same command as the Dockerfile), sets up a throw-away store
# with a development key and an API client, starts `offer-signer serve` on 127.0.0.1:$PORT
# with rate limits off, drives it with wrk, then prints requests/s, p50, p99, the server's CPU
# per request, the non-2xx count and the server's RSS, checks the audit chain, and stops the
# server.
#
# Usage:   Scripts/benchmark.sh
# Env:     DURATION=30 (seconds)  CONNECTIONS=64  THREADS=2  PORT=18181
#          FORMATS=legacy (or jws, or legacy,jws)  WARMUP=3 (seconds)
#          THINK_MS=0 (N > 0: each connection waits N ms after an answer before its next
#          request, to measure latency below saturation; wrk's resolution is 1 ms)
#          RATE=0 (N > 0: a fixed offered load of N requests/s, paced by the Lua script from a
#          monotonic clock; prints the offered and the achieved rate. CONNECTIONS then defaults
#          to max(16, N/250); excludes THINK_MS)
#          GOALS=1 (three runs on one server: saturation (CONNECTIONS, default 64), then
#          RATE=1000, then RATE=half the measured saturation, each DURATION seconds; prints a
#          table of the goals with PASS or MISS: on SQLite >= 15,000 signatures/s at saturation,
#          p99 <= 2 ms at 1,000 requests/s offered, p99 <= 5 ms at half the saturation rate; on
#          PostgreSQL >= 10,000/s and p99 <= 3 ms at 1,000/s. Skips the floor)
#          FLOOR_SECONDS=5 (then drives plain GET /healthz for this long with the same wrk
#          settings and prints it as the floor: the stack's cost for a request that does no
#          work; 0 skips it)
#          STORE=sqlite (default) or postgres: a throw-away PostgreSQL cluster (initdb and pg_ctl
#          from /usr/lib/postgresql/*/bin, run as the postgres user when root), or the database
#          POSTGRES_URL names (it must be empty or hold only this benchmark's data)
#          INSTANCES=1 (N > 1 needs STORE=postgres: N servers on ports PORT..PORT+N-1, driven by
#          N wrk processes at once, CONNECTIONS/N connections each)
#          SKIP_BUILD=1 (use the existing .build/release/offer-signer)
#          OFFER_SIGNER_BIN=path (benchmark that binary instead; no build)
# Needs:   wrk (`apt-get install -y wrk`), curl, openssl, python3; for STORE=postgres without
#          POSTGRES_URL, the PostgreSQL server (`apt-get install -y postgresql`).
# Exit:    0 when every response was 2xx and the audit chain is intact; non-zero otherwise.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/opt/swift/usr/bin:$PATH

DURATION=${DURATION:-30}
RATE=${RATE:-0}
GOALS=${GOALS:-0}
case "$RATE" in
    '' | *[!0-9]*) echo "error: RATE='$RATE' is not a whole number of requests per second" >&2; exit 2 ;;
esac
# Fixed-load runs need fewer connections than saturation: enough for the rate at a few ms each.
rate_connections() { local n=$(( ($1 + 249) / 250 )); echo $(( n > 16 ? n : 16 )); }
CONNECTIONS_GIVEN=${CONNECTIONS:-}
if [ "$RATE" -gt 0 ] && [ -z "$CONNECTIONS_GIVEN" ]; then CONNECTIONS=$(rate_connections "$RATE"); fi
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
PORT=${PORT:-18181}
FORMATS=${FORMATS:-legacy}
WARMUP=${WARMUP:-3}
THINK_MS=${THINK_MS:-0}
FLOOR_SECONDS=${FLOOR_SECONDS:-5}
STORE_KIND=${STORE:-sqlite}
INSTANCES=${INSTANCES:-1}
case "$STORE_KIND" in
    sqlite | postgres) ;;
    *) echo "error: STORE='$STORE_KIND' is not sqlite or postgres" >&2; exit 2 ;;
esac
case "$INSTANCES" in
    '' | *[!0-9]* | 0) echo "error: INSTANCES='$INSTANCES' is not a number of servers (1 or more)" >&2; exit 2 ;;
esac
if [ "$INSTANCES" -gt 1 ] && [ "$STORE_KIND" != postgres ]; then
    echo "error: INSTANCES=$INSTANCES needs STORE=postgres (several servers on one SQLite file are not supported)" >&2; exit 2
fi
case "$THINK_MS" in
    '' | *[!0-9]*) echo "error: THINK_MS='$THINK_MS' is not a whole number of milliseconds" >&2; exit 2 ;;
esac
case "$FLOOR_SECONDS" in
    '' | *[!0-9]*) echo "error: FLOOR_SECONDS='$FLOOR_SECONDS' is not a whole number of seconds" >&2; exit 2 ;;
esac
if [ "$RATE" -gt 0 ] && [ "$THINK_MS" -gt 0 ]; then
    echo "error: RATE and THINK_MS exclude each other (a fixed rate already sets the pauses)" >&2; exit 2
fi
if [ "$GOALS" = 1 ] && { [ "$RATE" -gt 0 ] || [ "$THINK_MS" -gt 0 ]; }; then
    echo "error: GOALS=1 chooses its own rates; unset RATE and THINK_MS" >&2; exit 2
fi

for tool in wrk curl openssl python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: '$tool' is not installed." >&2
        case "$tool" in
            wrk) echo "Install it with: apt-get install -y wrk" >&2 ;;
            curl) echo "Install it with: apt-get install -y curl" >&2 ;;
            openssl) echo "Install it with: apt-get install -y openssl" >&2 ;;
            python3) echo "Install it with: apt-get install -y python3" >&2 ;;
        esac
        exit 2
    fi
done

# --- Build ----------------------------------------------------------------------------
BUILD=(swift build -c release --product offer-signer --static-swift-stdlib)
if [ -n "${OFFER_SIGNER_BIN:-}" ]; then
    BIN=$OFFER_SIGNER_BIN
else
    if [ "${SKIP_BUILD:-0}" != 1 ]; then
        echo "==> ${BUILD[*]}"
        "${BUILD[@]}"
    fi
    BIN="$(pwd)/.build/release/offer-signer"
fi
[ -x "$BIN" ] || { echo "error: $BIN not found; run ${BUILD[*]}" >&2; exit 2; }

# --- Throw-away store, master key, key and API client ----------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-bench.XXXXXX")
SERVER_PID=
EXTRA_SERVER_PIDS=()
PG_DATA=
cleanup() {
    for pid in "$SERVER_PID" "${EXTRA_SERVER_PIDS[@]}"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    stop_throwaway_postgres
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- PostgreSQL (STORE=postgres): Scripts/benchmark-postgres.sh ---------------------------
# shellcheck source=benchmark-postgres.sh
. Scripts/benchmark-postgres.sh

# --- Several servers (INSTANCES=N) ---------------------------------------------------------
# Server i listens on PORT+i; server 0 is SERVER_PID, the others are EXTRA_SERVER_PIDS.
start_extra_servers() {
    local i
    for ((i = 1; i < INSTANCES; i++)); do
        "$BIN" serve --store "$STORE" --master-key-file "$MASTER" --port "$((PORT + i))" --operator-token-file "$OPERATOR_TOKEN_FILE" \
            --log-level warning --client-rate 0 --token-rate 0 > "$WORK/server-$i.log" 2>&1 &
        EXTRA_SERVER_PIDS+=($!)
    done
    for ((i = 1; i < INSTANCES; i++)); do
        for _ in $(seq 1 100); do
            curl -fsS "http://127.0.0.1:$((PORT + i))/readyz" >/dev/null 2>&1 && break
            sleep 0.1
        done
        curl -fsS "http://127.0.0.1:$((PORT + i))/readyz" >/dev/null || { echo "error: server $i never became ready" >&2; cat "$WORK/server-$i.log" >&2; exit 1; }
    done
}
# All servers' CPU ticks.
all_server_ticks() {
    local pid
    for pid in "$SERVER_PID" "${EXTRA_SERVER_PIDS[@]}"; do awk '{print $14 + $15}' "/proc/$pid/stat"; done | awk '{ total += $1 } END { print total }'
}
# One wrk per server at once, CONNECTIONS/INSTANCES connections each; wrk i writes wrk-i.txt.
# The combined report in $WORK/wrk.txt: requests, rps and non-2xx summed, p50 and p99 the
# highest of the servers' (a bound on the deployment's, not its exact percentile).
run_wrk_on_all_servers() {
    local duration=$1 i pids=()
    local per=$(( CONNECTIONS / INSTANCES > 0 ? CONNECTIONS / INSTANCES : 1 ))
    local per_threads=$(( THREADS / INSTANCES > 0 ? THREADS / INSTANCES : 1 ))
    for ((i = 0; i < INSTANCES; i++)); do
        wrk -t"$per_threads" -c"$per" -d"${duration}s" --latency -s "$LUA" "http://127.0.0.1:$((PORT + i))/v1/offers/signatures" > "$WORK/wrk-$i.txt" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    python3 - "$WORK" "$INSTANCES" > "$WORK/wrk.txt" <<'PY'
import re, sys
work, n = sys.argv[1], int(sys.argv[2])
fields = []
for i in range(n):
    text = open(f"{work}/wrk-{i}.txt").read()
    items = [item for l in text.splitlines() if l.startswith("BENCH ") for item in l.split()[1:]]
    fields.append(dict(item.split("=", 1) for item in items))
    print(f"server {i}: " + " ".join(items))
total = lambda k: sum(float(f.get(k, 0)) for f in fields)
worst = lambda k: max(float(f.get(k, 0)) for f in fields)
# Every field one wrk prints, so the report reads the same fields whatever INSTANCES is: the
# counts summed, the latencies the worst server's (wrk's percentiles cannot be merged).
print("BENCH requests=%d rps=%.0f p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f max_ms=%.2f non2xx=%d socket_errors=%d" % (
    total("requests"), total("rps"), worst("p50_ms"), worst("p90_ms"), worst("p99_ms"), worst("max_ms"), total("non2xx"), total("socket_errors")))
PY
    cat "$WORK/wrk.txt"
}

STORE="$WORK/offer-signer.sqlite"
if [ "$STORE_KIND" = postgres ]; then
    if [ -n "${POSTGRES_URL:-}" ]; then STORE=$POSTGRES_URL; else start_throwaway_postgres; fi
fi
MASTER="$WORK/master.key"
KEY="$WORK/AuthKey_BENCH00001.p8"
(umask 077 && openssl rand -base64 32 > "$MASTER")
chmod 600 "$MASTER"
# GET /metrics answers operators only: the run reads it (CPU and commit figures) with this token.
OPERATOR_TOKEN_FILE="$WORK/operator-token"
(umask 077 && openssl rand -hex 32 > "$OPERATOR_TOKEN_FILE")

"$BIN" keys generate --key-id BENCH00001 --output "$KEY" 2>/dev/null
"$BIN" keys import --store "$STORE" --master-key-file "$MASTER" \
    --key-id BENCH00001 --bundle-id com.example.bench \
    --issuer-id "$(python3 -c 'import uuid; print(uuid.uuid4())')" --file "$KEY" \
    --development --actor benchmark --reason "benchmark run"
CLIENT_JSON=$("$BIN" clients create --store "$STORE" --master-key-file "$MASTER" --name bench --bundle-id com.example.bench --json --actor benchmark)
SECRET=$(printf '%s' "$CLIENT_JSON" | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')
export OFFER_SIGNER_BENCH_SECRET="$SECRET"
export OFFER_SIGNER_BENCH_FORMATS="$FORMATS"
export OFFER_SIGNER_BENCH_THINK_MS="$THINK_MS"
export OFFER_SIGNER_BENCH_RATE="$RATE"
export OFFER_SIGNER_BENCH_THREADS="$THREADS"

# --- Server ---------------------------------------------------------------------------
"$BIN" serve --store "$STORE" --master-key-file "$MASTER" --port "$PORT" --operator-token-file "$OPERATOR_TOKEN_FILE" \
    --log-level warning --client-rate 0 --token-rate 0 > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 100); do
    if curl -fsS "$URL/readyz" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "error: the server exited; its log:" >&2
        cat "$WORK/server.log" >&2
        exit 1
    fi
    sleep 0.1
done
curl -fsS "$URL/readyz" >/dev/null || { echo "error: $URL/readyz never answered 200" >&2; cat "$WORK/server.log" >&2; exit 1; }
[ "$INSTANCES" -gt 1 ] && start_extra_servers

# One request by hand: shows the problem document if something is wrong before the run.
STATUS=$(curl -sS -o "$WORK/first.json" -w '%{http_code}' -X POST "$URL/v1/offers/signatures" \
    -H 'Content-Type: application/json' -H "Authorization: Bearer $SECRET" \
    -d "{\"productID\":\"com.example.bench.monthly\",\"offerID\":\"BENCH_OFFER\",\"appAccountToken\":\"$(python3 -c 'import uuid; print(uuid.uuid4())')\"}")
if [ "$STATUS" != 201 ]; then
    echo "error: a single signing request answered $STATUS:" >&2
    cat "$WORK/first.json" >&2
    exit 1
fi

LUA="Scripts/benchmark-signatures.lua"
echo "==> warm-up: wrk -t$THREADS -c$CONNECTIONS -d${WARMUP}s"
if [ "$INSTANCES" -gt 1 ]; then
    run_wrk_on_all_servers "$WARMUP" >/dev/null
else
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"${WARMUP}s" -s "$LUA" "$URL/v1/offers/signatures" >/dev/null
fi

# The Lua script's done() prints "BENCH name=value" lines: field NAME FILE.
field_of() { grep '^BENCH ' "$2" | grep -o "$1=[^ ]*" | head -n 1 | cut -d= -f2; }

# --- GOALS=1: saturation, 1,000 requests/s, half the saturation rate ------------------
if [ "$GOALS" = 1 ]; then
    # run NAME RATE CONNECTIONS: one measured wrk run (RATE 0 = saturation).
    run() {
        local label
        if [ "$2" -gt 0 ]; then label="fixed load, $2 requests/s offered"; else label="saturation"; fi
        echo "==> $1: OFFER_SIGNER_BENCH_RATE=$2 wrk -t$THREADS -c$3 -d${DURATION}s --latency -s $LUA $URL/v1/offers/signatures ($label, formats: $FORMATS)"
        OFFER_SIGNER_BENCH_RATE=$2 wrk -t"$THREADS" -c"$3" -d"${DURATION}s" --latency -s "$LUA" "$URL/v1/offers/signatures" > "$WORK/wrk-$1.txt"
        grep -E '^(BENCH|  Latency|Requests/sec)' "$WORK/wrk-$1.txt"
    }
    run saturation 0 "$CONNECTIONS"
    SATURATION=$(field_of rps "$WORK/wrk-saturation.txt")
    HALF=$(awk -v r="$SATURATION" 'BEGIN { printf "%d", r / 2 }')
    run rate1000 1000 "$(rate_connections 1000)"
    run half "$HALF" "$(rate_connections "$HALF")"

    AUDIT_STATUS=0
    AUDIT=$("$BIN" audit verify --store "$STORE" 2>/dev/null) || AUDIT_STATUS=$?
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=

    echo
    echo "==> goals (${DURATION}s per run, $THREADS wrk threads, formats $FORMATS, loopback, $(nproc) cores shared by wrk and the server)"
    python3 - "$WORK" "$SATURATION" "$HALF" "$STORE_KIND" <<'PY'
import re, sys
work, saturation, half, store = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# The goals of the store measured: SQLite's (the first wave's), or PostgreSQL's (one instance,
# every commit durable), which set no goal at half the saturation rate.
if store == "postgres":
    throughput_goal, p99_at_1000_goal, p99_at_half_goal = 10000, 3.0, None
else:
    throughput_goal, p99_at_1000_goal, p99_at_half_goal = 15000, 2.0, 5.0

def fields(name):
    values = {}
    for line in open(f"{work}/wrk-{name}.txt"):
        if line.startswith("BENCH "):
            values.update(dict(pair.split("=", 1) for pair in line.split()[1:]))
    return values

def connections(name):
    for line in open(f"{work}/wrk-{name}.txt"):
        match = re.search(r"(\d+) connections", line)
        if match:
            return match.group(1)
    return "?"

runs = [("saturation", "saturation", None), ("rate1000", "1,000/s", 1000), ("half", f"{half:,}/s (half)", half)]
print(f"{'run':<20} {'conns':>5} {'offered/s':>10} {'achieved/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'non-2xx':>8}")
for name, label, offered in runs:
    f = fields(name)
    print(f"{label:<20} {connections(name):>5} {offered or '-':>10} {float(f['rps']):>10.0f} {float(f['p50_ms']):>8.3f} "
          f"{float(f['p90_ms']):>8.3f} {float(f['p99_ms']):>8.3f} {float(f['max_ms']):>8.3f} {f['non2xx']:>8}")

def verdict(passed):
    return "PASS" if passed else "MISS"

def paced(name, offered):
    # A fixed-load run counts only when it achieved (nearly) the offered rate.
    achieved = float(fields(name)["rps"])
    return achieved >= 0.95 * offered, achieved

print()
print(f"{'goal':<48} {'measured':<34} verdict")
print(f"{f'throughput at saturation >= {throughput_goal:,}/s':<48} {f'{saturation:,.0f}/s':<34} {verdict(saturation >= throughput_goal)}")
for name, offered, limit, text in [("rate1000", 1000, p99_at_1000_goal, f"p99 <= {p99_at_1000_goal:g} ms at 1,000 requests/s offered"),
                                   ("half", half, p99_at_half_goal, f"p99 <= {p99_at_half_goal or 0:g} ms at half saturation ({half:,}/s)")]:
    p99 = float(fields(name)["p99_ms"])
    reached, achieved = paced(name, offered)
    measured = f"p99 {p99:.3f} ms at {achieved:,.0f}/s achieved"
    if limit is None:
        print(f"{f'p99 at half saturation ({half:,}/s)':<48} {measured:<34} (no goal for {store})")
        continue
    note = "" if reached else " (achieved < 95% of offered)"
    print(f"{text:<48} {measured:<34} {verdict(p99 <= limit and reached)}{note}")
PY
    echo "audit: $AUDIT"
    FAILED=0
    for name in saturation rate1000 half; do
        NON2XX=$(field_of non2xx "$WORK/wrk-$name.txt")
        if [ "${NON2XX:-1}" != 0 ]; then echo "FAIL: $NON2XX responses of the $name run were not 2xx" >&2; FAILED=1; fi
    done
    if [ "$AUDIT_STATUS" != 0 ]; then echo "FAIL: the audit chain is not intact (audit verify exited $AUDIT_STATUS)" >&2; FAILED=1; fi
    # A MISS is a figure, not a failure of the script: the exit status speaks for the run's health.
    exit "$FAILED"
fi

# The server's CPU time (user + system, in clock ticks) around the measured run: CPU per
# request varies less from run to run than requests/s when the VM's speed drifts.
server_ticks() { all_server_ticks; }
TICKS_BEFORE=$(server_ticks)
PG_TICKS_BEFORE=$(postgres_ticks)
curl -fsS -H "Authorization: Bearer $(cat "$OPERATOR_TOKEN_FILE")" "$URL/metrics" > "$WORK/metrics-before.txt"
if [ "$RATE" -gt 0 ]; then LOAD="fixed load: $RATE requests/s offered"; else LOAD="think time: $THINK_MS ms"; fi
echo "==> wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s --latency -s $LUA $URL/v1/offers/signatures (formats: $FORMATS, $LOAD)"
if [ "$INSTANCES" -gt 1 ]; then
    run_wrk_on_all_servers "$DURATION"
else
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$LUA" "$URL/v1/offers/signatures" | tee "$WORK/wrk.txt"
fi

TICKS_AFTER=$(server_ticks)
PG_TICKS_AFTER=$(postgres_ticks)
curl -fsS -H "Authorization: Bearer $(cat "$OPERATOR_TOKEN_FILE")" "$URL/metrics" > "$WORK/metrics-after.txt"
# From the server's own /metrics, over the measured run only: time spent inside the server per
# signing request (from the request head to the response; the rest of wrk's latency is socket
# queues, event loops and wrk itself) and the audit's group commits.
SERVER_SIDE=$(python3 - "$WORK/metrics-before.txt" "$WORK/metrics-after.txt" <<'PY'
import re, sys

def load(path):
    values = {}
    for line in open(path):
        match = re.match(r'^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$', line.strip())
        if match:
            values[(match.group(1), match.group(2) or "")] = float(match.group(3))
    return values

before, after = load(sys.argv[1]), load(sys.argv[2])
def delta(name, labels=""):
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

route = 'route="/v1/offers/signatures",method="POST",status="201"'
count = delta("http_request_duration_seconds_count", "{" + route + "}")
total = delta("http_request_duration_seconds_sum", "{" + route + "}")
buckets = sorted(
    (float(re.search(r'le="([^"]+)"', labels).group(1)), delta(name, labels))
    for (name, labels) in after
    if name == "http_request_duration_seconds_bucket" and route in labels and 'le="+Inf"' not in labels)
def within(share):
    for bound, seen in buckets:
        if count and seen >= share * count:
            return "%g ms" % (bound * 1000)
    return "more than %g ms" % (buckets[-1][0] * 1000) if buckets else "n/a"
commits = delta("audit_commit_duration_seconds_count")
if count and commits:
    print("mean %.2f ms, p50 within %s, p99 within %s (histogram bounds); audit: %.1f entries per group commit, mean commit %.2f ms" % (
        total / count * 1000, within(0.5), within(0.99), delta("audit_commit_entries_total") / commits,
        delta("audit_commit_duration_seconds_sum") / commits * 1000))
else:
    print("n/a")
PY
)
RSS=$(awk '/^VmRSS:/ {print $2 " " $3}' "/proc/$SERVER_PID/status")
size_mib() { if [ -f "$1" ]; then echo $(( $(stat -c %s "$1") / 1048576 )); else echo 0; fi; }
STORE_FILES="$(size_mib "$STORE") MiB database, $(size_mib "$STORE-wal") MiB write-ahead log"
[ "$STORE_KIND" = postgres ] && STORE_FILES="PostgreSQL ($([ -n "$PG_DATA" ] && echo "throw-away cluster, $(du -sm "$PG_DATA" | cut -f1) MiB" || echo POSTGRES_URL))"
HWM=$(awk '/^VmHWM:/ {print $2 " " $3}' "/proc/$SERVER_PID/status")
field() { field_of "$1" "$WORK/wrk.txt"; }
RPS=$(field rps)
P50=$(field p50_ms)
P90=$(field p90_ms)
P99=$(field p99_ms)
MAX=$(field max_ms)
NON2XX=$(field non2xx)
SOCKET_ERRORS=$(field socket_errors)
REQUESTS=$(field requests)
CPU=$(awk -v t=$((TICKS_AFTER - TICKS_BEFORE)) -v hz="$(getconf CLK_TCK)" -v n="$REQUESTS" -v d="$DURATION" \
    'BEGIN { if (n > 0) printf "%.0f us per request (%.2f cores)", t / hz * 1e6 / n, t / hz / d; else print "n/a" }')
PG_CPU="n/a (SQLite store)"
if [ "$STORE_KIND" = postgres ]; then
    if [ "$PG_TICKS_BEFORE" = n/a ]; then
        PG_CPU="n/a (POSTGRES_URL: not a cluster this script started)"
    else
        PG_CPU=$(awk -v t=$((PG_TICKS_AFTER - PG_TICKS_BEFORE)) -v hz="$(getconf CLK_TCK)" -v n="$REQUESTS" -v d="$DURATION" \
            'BEGIN { if (n > 0) printf "%.0f us per request (%.2f cores)", t / hz * 1e6 / n, t / hz / d; else print "n/a" }')
    fi
fi

# --- Floor: the same wrk settings against GET /healthz, which does no work ------------
# After the measured run and its CPU and RSS readings, so it changes none of them.
FLOOR="skipped (FLOOR_SECONDS=0)"
if [ "$FLOOR_SECONDS" -gt 0 ]; then
    echo "==> floor: wrk -t$THREADS -c$CONNECTIONS -d${FLOOR_SECONDS}s --latency -s Scripts/benchmark-floor.lua $URL/healthz"
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"${FLOOR_SECONDS}s" --latency -s Scripts/benchmark-floor.lua "$URL/healthz" > "$WORK/floor.txt"
    floor_field() { grep '^BENCH ' "$WORK/floor.txt" | grep -o "$1=[^ ]*" | head -n 1 | cut -d= -f2; }
    FLOOR="$(floor_field rps) requests/s, p50 $(floor_field p50_ms) ms, p99 $(floor_field p99_ms) ms (GET /healthz, ${FLOOR_SECONDS}s, same wrk settings, no Lua per request)"
fi

# --- Audit chain (every 201 above committed its record before it was sent) ------------
AUDIT_STATUS=0
AUDIT=$("$BIN" audit verify --store "$STORE" 2>/dev/null) || AUDIT_STATUS=$?

for pid in "$SERVER_PID" "${EXTRA_SERVER_PIDS[@]}"; do
    kill "$pid"
    wait "$pid" 2>/dev/null || true
done
SERVER_PID=
EXTRA_SERVER_PIDS=()

cat <<EOF

==> results (${DURATION}s, $CONNECTIONS connections, $THREADS wrk threads, formats $FORMATS, $LOAD, loopback, $(nproc) cores, store $STORE_KIND, $INSTANCES instance(s))
requests:        $REQUESTS
offered rate:    $(if [ "$RATE" -gt 0 ]; then echo "$RATE requests/s (fixed load)"; else echo "none (each connection sends when its answer is in)"; fi)
requests/s:      $RPS (achieved)
latency p50:     $P50 ms
latency p90:     $P90 ms
latency p99:     $P99 ms
latency max:     $MAX ms
non-2xx:         $NON2XX
socket errors:   $SOCKET_ERRORS
server CPU:      $CPU (all instances)
PostgreSQL CPU:  $PG_CPU
server RSS:      $RSS after the run (peak $HWM)$([ "$INSTANCES" -gt 1 ] && echo " (instance 0)")
server time:     $SERVER_SIDE$([ "$INSTANCES" -gt 1 ] && echo " (instance 0)")
floor:           $FLOOR
store files:     $STORE_FILES
audit:           $AUDIT
EOF

FAILED=0
if [ "${NON2XX:-1}" != 0 ]; then
    echo "FAIL: $NON2XX responses were not 2xx; server log:" >&2
    tail -n 20 "$WORK/server.log" >&2
    FAILED=1
fi
if [ "$AUDIT_STATUS" != 0 ]; then
    echo "FAIL: the audit chain is not intact (audit verify exited $AUDIT_STATUS)" >&2
    FAILED=1
fi
exit "$FAILED"
