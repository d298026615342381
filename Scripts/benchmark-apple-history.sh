#!/usr/bin/env bash
# What asking Apple costs: POST /v1/offers/signatures for an offer decided on Apple's history
# (`historySource: apple`), against a fake App Store Server API on loopback that answers each
# call after DELAY_MS (Scripts/fake-app-store-server-api.py; every request names a new customer,
# so none is served from the service's cache).
#
# Prints, for a latency run at a fixed offered load (RATE requests/s over PACED_CONNECTIONS
# connections, against the fake API alone at the same load), a closed-loop run (CONNECTIONS
# connections, each sending its next request as soon as it has its answer), a burst sent once (BURST_CONNECTIONS connections,
# 1,000 by default, each sending one request: that many in flight at once, for different
# customers; ONCE_SECONDS long) and a sustained burst run (BURST_CONNECTIONS connections, each
# sending its next request as soon as it has its answer): requests/s, p50/p99, non-2xx and socket errors,
# the fake API's own p50/p99 at the same concurrency (the floor: what Apple's side costs), what
# the service adds at p99 (service p99 − floor p99), and the most connections the service held
# open to the fake API at once (bounded by its connection pool).
#
# LOOKUP_CPU=1 measures instead what a lookup asked again costs the service: the service asks
# Apple on every request (--apple-api-cache-seconds 0), the fake's customers have TRANSACTIONS
# paid months (20 in this mode), and paced runs at RATE: "first" (a new customer each
# request: every item verified in full), then ROUNDS pairs of "repeated" (REPEAT_CUSTOMERS
# customers over and over, each asked once before the run: their items were verified before, and
# Apple's answer is the same bytes) and "plain" (an offer without rules: no lookup), alternated.
# It prints the service's CPU a request for each run, and the lookup's share (repeated - plain)
# of each pair and their median, against the goal of at most 1 ms.
# The fake API runs in its own process, so none of its work is in the service's figure.
#
# Usage:   Scripts/benchmark-apple-history.sh
# Env:     DURATION=15 (seconds per run)  RATE=100  PACED_CONNECTIONS=32  WARMUP=3 (seconds at
#          RATE before the runs, not reported)  CONNECTIONS=16
#          BURST_CONNECTIONS=1000  THREADS=2
#          ONCE_SECONDS=8  DELAY_MS=50  PORT=18191  FAKE_PORT=18192  CUSTOMERS=1000
#          SKIP_BUILD=1 (use the existing .build/release/offer-signer)
#          OFFER_SIGNER_BIN=path (benchmark that binary instead; no build)
#          LOOKUP_CPU=1 (see above; then RATE=500, DURATION=10, TRANSACTIONS=20, REPEAT_CUSTOMERS=50,
#          ROUNDS=3)
# Needs:   wrk, curl, openssl, python3 with the `cryptography` package.
# Exit:    0 when every response was 2xx; non-zero otherwise.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/opt/swift/usr/bin:$PATH

LOOKUP_CPU=${LOOKUP_CPU:-0}
if [ "$LOOKUP_CPU" = 1 ]; then
    DURATION=${DURATION:-10}
    RATE=${RATE:-500}
    TRANSACTIONS=${TRANSACTIONS:-20}
    REPEAT_CUSTOMERS=${REPEAT_CUSTOMERS:-50}
    ROUNDS=${ROUNDS:-3}
    CACHE_OPTIONS=(--apple-api-cache-seconds 0)
else
    DURATION=${DURATION:-15}
    RATE=${RATE:-100}
    TRANSACTIONS=${TRANSACTIONS:-6}
    REPEAT_CUSTOMERS=0
    CACHE_OPTIONS=()
fi
CONNECTIONS=${CONNECTIONS:-16}
WARMUP=${WARMUP:-3}
PACED_CONNECTIONS=${PACED_CONNECTIONS:-32}
BURST_CONNECTIONS=${BURST_CONNECTIONS:-1000}
ONCE_SECONDS=${ONCE_SECONDS:-8}
THREADS=${THREADS:-2}
DELAY_MS=${DELAY_MS:-50}
PORT=${PORT:-18191}
FAKE_PORT=${FAKE_PORT:-18192}
CUSTOMERS=${CUSTOMERS:-1000}

for tool in wrk curl openssl python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is not installed (apt-get install -y $tool)" >&2; exit 2; }
done
python3 -c 'import cryptography' 2>/dev/null || { echo "error: python3 lacks the 'cryptography' package (pip install cryptography)" >&2; exit 2; }

BUILD=(swift build -c release --product offer-signer --static-swift-stdlib)
if [ "${SKIP_BUILD:-0}" != 1 ] && [ -z "${OFFER_SIGNER_BIN:-}" ]; then
    echo "==> ${BUILD[*]}"
    "${BUILD[@]}"
fi
BIN="${OFFER_SIGNER_BIN:-$(pwd)/.build/release/offer-signer}"
[ -x "$BIN" ] || { echo "error: $BIN not found; run ${BUILD[*]}" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-apple-bench.XXXXXX")
SERVER_PID=
FAKE_PID=
cleanup() {
    for pid in "$SERVER_PID" "$FAKE_PID"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
ulimit -n 8192 2>/dev/null || true

for port in "$PORT" "$FAKE_PORT"; do
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
        echo "error: something already answers on port $port (a benchmark left running?); stop it or set PORT / FAKE_PORT" >&2
        exit 2
    fi
done

# --- The fake App Store Server API -----------------------------------------------------
python3 Scripts/fake-app-store-server-api.py "$FAKE_PORT" "$WORK/root.pem" "$CUSTOMERS" "$DELAY_MS" com.example.bench "$TRANSACTIONS" \
    > "$WORK/fake.log" 2>&1 &
FAKE_PID=$!
for _ in $(seq 1 300); do
    grep -q ready "$WORK/fake.log" 2>/dev/null && break
    kill -0 "$FAKE_PID" 2>/dev/null || { echo "error: the fake API exited:" >&2; cat "$WORK/fake.log" >&2; exit 1; }
    sleep 0.1
done
grep -q ready "$WORK/fake.log" || { echo "error: the fake API did not start" >&2; exit 1; }

# --- Store, key, client, catalog -------------------------------------------------------
STORE="$WORK/offer-signer.sqlite"
MASTER="$WORK/master.key"
KEY="$WORK/AuthKey_BENCH00001.p8"
(umask 077 && openssl rand -base64 32 > "$MASTER")
"$BIN" keys generate --key-id BENCH00001 --output "$KEY" 2>/dev/null
"$BIN" keys import --store "$STORE" --master-key-file "$MASTER" --key-id BENCH00001 --bundle-id com.example.bench \
    --issuer-id "$(python3 -c 'import uuid; print(uuid.uuid4())')" --file "$KEY" --development --actor benchmark --reason "benchmark run"
SECRET=$("$BIN" clients create --store "$STORE" --master-key-file "$MASTER" --name bench --bundle-id com.example.bench --json --actor benchmark \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')
cat > "$WORK/offers.json" <<JSON
{"apps": {"com.example.bench": {"appAppleID": 1234567890, "environments": ["Production"],
          "appStoreServerAPI": {"productionURL": "http://127.0.0.1:$FAKE_PORT/production"}}},
 "offers": [{"offerID": "BENCH_APPLE", "bundleID": "com.example.bench", "productIDs": ["com.example.bench.monthly"],
             "subscriptionGroupID": "BENCHGROUP", "kind": "win-back", "historySource": "apple",
             "rules": {"minPaidMonths": 3, "lapsedMonths": {"min": 1, "max": 24}}},
            {"offerID": "BENCH_PLAIN", "bundleID": "com.example.bench", "productIDs": ["com.example.bench.monthly"], "subscriptionGroupID": "BENCHGROUP", "kind": "any"}]}
JSON

OPERATOR_TOKEN_FILE="$WORK/operator-token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OPERATOR_TOKEN_FILE"
chmod 600 "$OPERATOR_TOKEN_FILE"
"$BIN" serve --store "$STORE" --master-key-file "$MASTER" --operator-token-file "$OPERATOR_TOKEN_FILE" --port "$PORT" --offers "$WORK/offers.json" --apple-root "$WORK/root.pem" \
    --log-level warning --client-rate 0 --token-rate 0 ${CACHE_OPTIONS[@]+"${CACHE_OPTIONS[@]}"} > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 100); do
    curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "error: the server exited:" >&2; cat "$WORK/server.log" >&2; exit 1; }
    sleep 0.1
done

STATUS=$(curl -sS -o "$WORK/first.json" -w '%{http_code}' -X POST "$URL/v1/offers/signatures" -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $SECRET" -d '{"productID":"com.example.bench.monthly","offerID":"BENCH_APPLE","transactionID":"500000000"}')
[ "$STATUS" = 201 ] || { echo "error: a single request answered $STATUS:" >&2; cat "$WORK/first.json" >&2; exit 1; }

LUA=Scripts/benchmark-apple-history.lua
field() { grep '^BENCH ' "$1" | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }
FAILED=0
# CPU seconds (user + system) a process has used so far.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
RUN=0
service() {
    local label=$1 connections=$2 once=${3:-0} rate=${4:-0} seconds=${5:-$DURATION} repeat=${6:-0} offer=${7:-BENCH_APPLE} server0 fake0
    RUN=$((RUN + 1))
    [ "$once" != 0 ] && seconds=$ONCE_SECONDS
    echo "==> $label: OFFER_SIGNER_BENCH_RUN=$RUN OFFER_SIGNER_BENCH_ONCE=$once OFFER_SIGNER_BENCH_RATE=$rate OFFER_SIGNER_BENCH_REPEAT=$repeat OFFER_SIGNER_BENCH_OFFER=$offer wrk -t$THREADS -c$connections -d${seconds}s --latency -s $LUA $URL/v1/offers/signatures"
    server0=$(ticks "$SERVER_PID")
    fake0=$(ticks "$FAKE_PID")
    OFFER_SIGNER_BENCH_SECRET="$SECRET" OFFER_SIGNER_BENCH_RUN=$RUN OFFER_SIGNER_BENCH_ONCE=$once \
        OFFER_SIGNER_BENCH_RATE=$rate OFFER_SIGNER_BENCH_THREADS=$THREADS OFFER_SIGNER_BENCH_REPEAT=$repeat OFFER_SIGNER_BENCH_OFFER=$offer \
        wrk -t"$THREADS" -c"$connections" -d"${seconds}s" --timeout "$((seconds + 10))s" --latency -s "$LUA" "$URL/v1/offers/signatures" > "$WORK/$label.txt"
    echo "$(( $(ticks "$SERVER_PID") - server0 )) $(( $(ticks "$FAKE_PID") - fake0 ))" > "$WORK/$label-cpu.txt"
    if [ "$(field "$WORK/$label.txt" non2xx)" != 0 ] || [ "$(field "$WORK/$label.txt" socket_errors)" != 0 ]; then FAILED=1; fi
}
floor() {
    local label=$1 connections=$2 rate=${3:-0}
    echo "==> $label floor (the fake API alone): OFFER_SIGNER_BENCH_RATE=$rate wrk -t$THREADS -c$connections -d${DURATION}s --latency -s $LUA http://127.0.0.1:$FAKE_PORT"
    OFFER_SIGNER_BENCH_SECRET="" OFFER_SIGNER_BENCH_RATE=$rate OFFER_SIGNER_BENCH_THREADS=$THREADS wrk -t"$THREADS" -c"$connections" -d"${DURATION}s" --timeout 10s --latency -s "$LUA" \
        "http://127.0.0.1:$FAKE_PORT" > "$WORK/$label-floor.txt"
}
report() {
    local label=$1 p99 floor
    p99=$(field "$WORK/$label.txt" p99_ms)
    floor=$(field "$WORK/$label-floor.txt" p99_ms)
    printf '%-8s %s requests/s, p50 %s ms, p99 %s ms, non-2xx %s, socket errors %s | fake API alone: p50 %s ms, p99 %s ms | added at p99: %s ms\n' \
        "$label" "$(field "$WORK/$label.txt" rps)" "$(field "$WORK/$label.txt" p50_ms)" "$p99" \
        "$(field "$WORK/$label.txt" non2xx)" "$(field "$WORK/$label.txt" socket_errors)" \
        "$(field "$WORK/$label-floor.txt" p50_ms)" "$floor" "$(awk -v a="$p99" -v b="$floor" 'BEGIN { printf "%.1f", a - b }')"
    read -r server_ticks fake_ticks < "$WORK/$label-cpu.txt"
    awk -v s="$server_ticks" -v f="$fake_ticks" -v hz="$HZ" -v d="$DURATION" -v r="$(field "$WORK/$label.txt" rps)" \
        'BEGIN { printf "         CPU: service %.0f%% of a core (%.0f us per request), fake API %.0f%% of a core\n", 100 * s / hz / d, (r > 0 ? 1e6 * s / hz / (r * d) : 0), 100 * f / hz / d }'
}
# CPU seconds of the service a request in a run, in microseconds.
cpu_per_request() {
    local label=$1 server_ticks fake_ticks
    read -r server_ticks fake_ticks < "$WORK/$label-cpu.txt"
    awk -v s="$server_ticks" -v hz="$HZ" -v n="$(grep -o 'requests=[0-9]*' "$WORK/$label.txt" | head -n 1 | cut -d= -f2)" \
        'BEGIN { printf "%.0f", (n > 0 ? 1e6 * s / hz / n : 0) }'
}
if [ "$LOOKUP_CPU" = 1 ]; then
    # Every customer of the repeated set asked once (its items verified in full), not reported.
    service warmup "$PACED_CONNECTIONS" 0 "$RATE" "$WARMUP" "$REPEAT_CUSTOMERS"
    service first "$PACED_CONNECTIONS" 0 "$RATE"
    # "repeated" and "plain" alternate, ROUNDS pairs: the machine's drift from one minute to the
    # next moves both runs of a pair alike, and the lookup's share is each pair's difference.
    for round in $(seq 1 "$ROUNDS"); do
        service "repeated-$round" "$PACED_CONNECTIONS" 0 "$RATE" "$DURATION" "$REPEAT_CUSTOMERS"
        service "plain-$round" "$PACED_CONNECTIONS" 0 "$RATE" "$DURATION" 0 BENCH_PLAIN
    done
    curl -fsS -H "Authorization: Bearer $(cat "$OPERATOR_TOKEN_FILE")" "$URL/metrics" > "$WORK/metrics.txt"
    echo
    echo "== the service's CPU a request, $RATE requests/s offered over $PACED_CONNECTIONS connections, $TRANSACTIONS-transaction customers, fake API answering in $DELAY_MS ms ($(nproc) cores)"
    labels=(first)
    for round in $(seq 1 "$ROUNDS"); do labels+=("repeated-$round" "plain-$round"); done
    for label in "${labels[@]}"; do
        printf '%-11s %s requests/s, p50 %s ms, p99 %s ms, non-2xx %s: %s us of service CPU a request\n' "$label" "$(field "$WORK/$label.txt" rps)" \
            "$(field "$WORK/$label.txt" p50_ms)" "$(field "$WORK/$label.txt" p99_ms)" "$(field "$WORK/$label.txt" non2xx)" "$(cpu_per_request "$label")"
    done
    echo "            (first: a new customer a request; repeated: $REPEAT_CUSTOMERS customers asked again; plain: an offer without rules)"
    echo "lookups by outcome (service /metrics):"
    grep '^app_store_server_api_lookups_total' "$WORK/metrics.txt" | sed 's/^/  /'
    SHARES=()
    for round in $(seq 1 "$ROUNDS"); do SHARES+=($(( $(cpu_per_request "repeated-$round") - $(cpu_per_request "plain-$round") ))); done
    SHARE=$(printf '%s\n' "${SHARES[@]}" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2)) }')
    echo "a lookup asked again (repeated - plain), each pair: ${SHARES[*]} us; median $SHARE us"
    awk -v c="$SHARE" 'BEGIN { exit !(c <= 1000) }' && echo "goal a lookup asked again <= 1 ms of service CPU: PASS ($SHARE us, the median of $ROUNDS pairs)" \
        || echo "goal a lookup asked again <= 1 ms of service CPU: MISS ($SHARE us, the median of $ROUNDS pairs)"
    [ "$FAILED" = 0 ] || { echo "FAILED: some requests were not answered 2xx (see above)" >&2; exit 1; }
    exit 0
fi
# Warm-up at the paced load, not reported: the first lookups fill the pool of connections to
# the fake API and the caches of validated chains.
service warmup "$PACED_CONNECTIONS" 0 "$RATE" "$WARMUP"
service paced "$PACED_CONNECTIONS" 0 "$RATE"
service latency "$CONNECTIONS"
service once "$BURST_CONNECTIONS" $((BURST_CONNECTIONS / THREADS))
service burst "$BURST_CONNECTIONS"
# Before the floor runs, which connect to the fake directly.
PEAK=$(curl -fsS "http://127.0.0.1:$FAKE_PORT/stats" | python3 -c 'import json, sys; print(json.load(sys.stdin)["peakConnections"])')
curl -fsS -H "Authorization: Bearer $(cat "$OPERATOR_TOKEN_FILE")" "$URL/metrics" > "$WORK/metrics.txt"
floor paced "$PACED_CONNECTIONS" "$RATE"
floor latency "$CONNECTIONS"
floor burst "$BURST_CONNECTIONS"

echo
echo "== offer-signer with Apple's history (fake API answering in $DELAY_MS ms, $(nproc) cores, shared machine)"
report paced
echo "         (fixed load: $RATE requests/s offered over $PACED_CONNECTIONS connections, the fake API alone at the same load)"
report latency
echo "         (closed loop: $CONNECTIONS connections, each sending its next request as soon as it has its answer)"
printf '%-8s %s requests answered of %s sent at once, non-2xx %s, socket errors %s, p50 %s ms, p99 %s ms, max %s ms\n' once \
    "$(grep '^BENCH requests=' "$WORK/once.txt" | grep -o 'requests=[0-9]*' | cut -d= -f2)" "$(( BURST_CONNECTIONS / THREADS * THREADS ))" \
    "$(field "$WORK/once.txt" non2xx)" "$(field "$WORK/once.txt" socket_errors)" "$(field "$WORK/once.txt" p50_ms)" \
    "$(field "$WORK/once.txt" p99_ms)" "$(field "$WORK/once.txt" max_ms)"
report burst
echo "most connections the service held open to the fake API at once: $PEAK"
echo "lookups by outcome (service /metrics):"
grep '^app_store_server_api_lookups_total' "$WORK/metrics.txt" | sed 's/^/  /'
grep '^app_store_server_api_unavailable_total' "$WORK/metrics.txt" | sed 's/^/  /' || true
if [ "$FAILED" != 0 ]; then
    echo "FAILED: some requests were not answered 2xx (see above)" >&2
    exit 1
fi
