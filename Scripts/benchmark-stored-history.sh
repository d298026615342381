#!/usr/bin/env bash
# Offers decided on Apple's history that App Store Server Notifications V2 already put in the
# store (no App Store Server API call on the way):
#   1. signing under rules (historySource apple, apps.<bundle>.notificationHistory) at saturation
#      (DECISION=refuse: a win-back offer every subscriber is refused, 403 not_eligible, instead);
#   2. Retention Messaging requests (POST /v1/apple/retention, each signed by an Apple-like chain,
#      each with a new requestIdentifier) at a fixed offered load.
# The store is seeded first: CUSTOMERS subscribers, six notifications each.
#
# Prints requests/s, p50/p99, non-2xx and the service's CPU for both runs, and PASS or MISS for
# every signing answer being the decision's (201, or 403 with DECISION=refuse) and for the goals:
# at least 5,000 signatures/s (not with DECISION=refuse); retention p99 at most 10 ms at 500/s.
#
# Usage:   Scripts/benchmark-stored-history.sh
# Env:     DURATION=10 (seconds per run)  CONNECTIONS=32  THREADS=2  CUSTOMERS=2000  DECISION=issue
#          RETENTION_RATE=500  RETENTION_CONNECTIONS=16  PORT=18193
#          RETENTION_SUBSCRIPTIONS=CUSTOMERS (how many subscriptions the retention requests name,
#          in turn; 1 is Apple's performance test: every request for the one original transaction
#          ID given to Initiate Performance Test)
#          STORE=sqlite (default) or postgres: a throw-away PostgreSQL cluster (initdb and pg_ctl
#          from /usr/lib/postgresql/*/bin, run as the postgres user when root), or the empty
#          database POSTGRES_URL names; PostgreSQL's CPU is then printed beside the service's
#          SKIP_BUILD=1 (use the existing .build/release/offer-signer)
#          OFFER_SIGNER_BIN=path (benchmark that binary instead; no build)
# Needs:   wrk, curl, openssl, python3 with the `cryptography` package; for STORE=postgres
#          without POSTGRES_URL, the PostgreSQL server (`apt-get install -y postgresql`).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/opt/swift/usr/bin:$PATH

DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-2}
CUSTOMERS=${CUSTOMERS:-2000}
RETENTION_RATE=${RETENTION_RATE:-500}
RETENTION_CONNECTIONS=${RETENTION_CONNECTIONS:-16}
RETENTION_SUBSCRIPTIONS=${RETENTION_SUBSCRIPTIONS:-$CUSTOMERS}
PORT=${PORT:-18193}
STORE_KIND=${STORE:-sqlite}
APP_APPLE_ID=1234567890
case "$STORE_KIND" in
    sqlite | postgres) ;;
    *) echo "error: STORE='$STORE_KIND' is not sqlite or postgres" >&2; exit 2 ;;
esac
# The offer the signing run asks for, and the answer each of its requests must get.
case "${DECISION:-issue}" in
    issue) SIGN_OFFER=STORED_RULES; SIGN_STATUS=201 ;;
    refuse) SIGN_OFFER=STORED_WINBACK; SIGN_STATUS=403 ;;
    *) echo "error: DECISION='$DECISION' is not issue or refuse" >&2; exit 2 ;;
esac

for tool in wrk curl openssl python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is not installed (apt-get install -y $tool)" >&2; exit 2; }
done
python3 -c 'import cryptography' 2>/dev/null || { echo "error: python3 lacks the 'cryptography' package (pip install cryptography)" >&2; exit 2; }
if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then
    echo "error: something already answers on port $PORT (a benchmark left running?); stop it or set PORT" >&2
    exit 2
fi

BUILD=(swift build -c release --product offer-signer --static-swift-stdlib)
if [ "${SKIP_BUILD:-0}" != 1 ] && [ -z "${OFFER_SIGNER_BIN:-}" ]; then
    echo "==> ${BUILD[*]}"
    "${BUILD[@]}"
fi
BIN="${OFFER_SIGNER_BIN:-$(pwd)/.build/release/offer-signer}"
[ -x "$BIN" ] || { echo "error: $BIN not found; run ${BUILD[*]}" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-stored-bench.XXXXXX")
SERVER_PID=
PG_DATA=
# shellcheck source=benchmark-postgres.sh
. Scripts/benchmark-postgres.sh
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    stop_throwaway_postgres
    rm -rf "$WORK"
}
trap cleanup EXIT
ulimit -n 8192 2>/dev/null || true

# --- Chain, store, key, client, catalog ------------------------------------------------
python3 Scripts/stored-history-fixtures.py chain "$WORK/chain.json" "$WORK/root.pem"
if [ "$STORE_KIND" = postgres ]; then
    if [ -n "${POSTGRES_URL:-}" ]; then STORE=$POSTGRES_URL; else start_throwaway_postgres; fi
else
    STORE="$WORK/offer-signer.sqlite"
fi
MASTER="$WORK/master.key"
KEY="$WORK/AuthKey_BENCH00001.p8"
(umask 077 && openssl rand -base64 32 > "$MASTER")
"$BIN" keys generate --key-id BENCH00001 --output "$KEY" 2>/dev/null
"$BIN" keys import --store "$STORE" --master-key-file "$MASTER" --key-id BENCH00001 --bundle-id com.example.bench \
    --issuer-id "$(python3 -c 'import uuid; print(uuid.uuid4())')" --file "$KEY" --development --actor benchmark --reason "benchmark run" >/dev/null
SECRET=$("$BIN" clients create --store "$STORE" --master-key-file "$MASTER" --name bench --bundle-id com.example.bench --json --actor benchmark \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')
# Apple's API points at a closed port: every decision must come from the store.
cat > "$WORK/offers.json" <<JSON
{"apps": {"com.example.bench": {"appAppleID": $APP_APPLE_ID, "environments": ["Production"], "notificationHistory": true,
          "appStoreServerAPI": {"productionURL": "http://127.0.0.1:9/closed"},
          "retention": {"products": {"com.example.bench.monthly": {
              "offers": [{"offerID": "RETAIN", "messageIdentifier": "6f1d4c3e-0000-4000-8000-000000000001"}],
              "fallback": {"message": {"messageIdentifier": "6f1d4c3e-0000-4000-8000-000000000002"}}}}}}},
 "offers": [
  {"offerID": "STORED_RULES", "bundleID": "com.example.bench", "productIDs": ["com.example.bench.monthly"], "subscriptionGroupID": "BENCHGROUP",
   "kind": "retention", "historySource": "apple", "rules": {"minPaidMonths": 3}},
  {"offerID": "STORED_WINBACK", "bundleID": "com.example.bench", "productIDs": ["com.example.bench.monthly"], "subscriptionGroupID": "BENCHGROUP",
   "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 1, "lapsedMonths": {"min": 1}}},
  {"offerID": "RETAIN", "bundleID": "com.example.bench", "productIDs": ["com.example.bench.monthly"], "subscriptionGroupID": "BENCHGROUP",
   "kind": "retention", "historySource": "apple", "rules": {"minPaidMonths": 3}}]}
JSON

OPERATOR_TOKEN_FILE="$WORK/operator-token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OPERATOR_TOKEN_FILE"
chmod 600 "$OPERATOR_TOKEN_FILE"
"$BIN" serve --store "$STORE" --master-key-file "$MASTER" --operator-token-file "$OPERATOR_TOKEN_FILE" --port "$PORT" --offers "$WORK/offers.json" --apple-root "$WORK/root.pem" \
    --log-level warning --client-rate 0 --token-rate 0 > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 100); do
    curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "error: the server exited:" >&2; cat "$WORK/server.log" >&2; exit 1; }
    sleep 0.1
done

echo "==> seeding $CUSTOMERS subscribers (6 notifications each)"
SEED_START=$(date +%s.%N)
python3 Scripts/stored-history-fixtures.py seed "$WORK/chain.json" "$URL" "$CUSTOMERS" com.example.bench "$APP_APPLE_ID"
SEED_SECONDS=$(awk -v a="$SEED_START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

STATUS=$(curl -sS -o "$WORK/first.json" -w '%{http_code}' -X POST "$URL/v1/offers/signatures" -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $SECRET" \
    -d '{"productID":"com.example.bench.monthly","offerID":"'"$SIGN_OFFER"'","transactionID":"600000000","appAccountToken":"00000000-0000-4000-8000-000000000000"}')
[ "$STATUS" = "$SIGN_STATUS" ] || { echo "error: a single request for $SIGN_OFFER answered $STATUS, not $SIGN_STATUS:" >&2; cat "$WORK/first.json" >&2; exit 1; }

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
field() { grep '^BENCH ' "$1" | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }
run() {
    local label=$1 connections=$2 rate=$3 before pg_before
    before=$(ticks "$SERVER_PID")
    pg_before=$(postgres_ticks)
    echo "==> $label: OFFER_SIGNER_BENCH_MODE=$label OFFER_SIGNER_BENCH_RATE=$rate wrk -t$THREADS -c$connections -d${DURATION}s --latency -s Scripts/benchmark-stored-history.lua"
    OFFER_SIGNER_BENCH_MODE=$label OFFER_SIGNER_BENCH_RATE=$rate OFFER_SIGNER_BENCH_THREADS=$THREADS OFFER_SIGNER_BENCH_SECRET="$SECRET" OFFER_SIGNER_BENCH_OFFER="$SIGN_OFFER" \
        OFFER_SIGNER_BENCH_CUSTOMERS="$CUSTOMERS" OFFER_SIGNER_BENCH_BODIES="$WORK/retention.jsonl" \
        wrk -t"$THREADS" -c"$connections" -d"${DURATION}s" --timeout 10s --latency -s Scripts/benchmark-stored-history.lua "$URL" > "$WORK/$label.txt"
    echo "$(( $(ticks "$SERVER_PID") - before ))" > "$WORK/$label-cpu.txt"
    if [ "$pg_before" = n/a ]; then echo n/a; else echo "$(( $(postgres_ticks) - pg_before ))"; fi > "$WORK/$label-pg-cpu.txt"
}
report() {
    local label=$1
    local pg=""
    if [ "$STORE_KIND" = postgres ]; then
        pg=$(awk -v t="$(cat "$WORK/$label-pg-cpu.txt")" -v hz="$HZ" -v d="$DURATION" \
            'BEGIN { if (t == "n/a") print ", PostgreSQL CPU n/a (POSTGRES_URL)"; else printf ", PostgreSQL CPU %.0f%% of a core", 100 * t / hz / d }')
    fi
    printf '%-10s %s requests/s, p50 %s ms, p99 %s ms, non-2xx %s, socket errors %s, service CPU %s%% of a core%s\n' "$label" \
        "$(field "$WORK/$label.txt" rps)" "$(field "$WORK/$label.txt" p50_ms)" "$(field "$WORK/$label.txt" p99_ms)" \
        "$(field "$WORK/$label.txt" non2xx)" "$(field "$WORK/$label.txt" socket_errors)" \
        "$(awk -v t="$(cat "$WORK/$label-cpu.txt")" -v hz="$HZ" -v d="$DURATION" 'BEGIN { printf "%.0f", 100 * t / hz / d }')" "$pg"
}

run sign "$CONNECTIONS" 0
# Fresh requests (signed now; the service answers those at most 5 minutes old), one per send.
python3 Scripts/stored-history-fixtures.py retention "$WORK/chain.json" "$WORK/retention.jsonl" \
    "$(( RETENTION_RATE * DURATION * 12 / 10 + 1000 ))" "$RETENTION_SUBSCRIPTIONS" "$APP_APPLE_ID"
run retention "$RETENTION_CONNECTIONS" "$RETENTION_RATE"
curl -fsS -H "Authorization: Bearer $(cat "$OPERATOR_TOKEN_FILE")" "$URL/metrics" > "$WORK/metrics.txt"

echo
echo "== offer-signer deciding on stored history ($(nproc) cores, shared machine, store $STORE_KIND; $CUSTOMERS subscribers seeded in $SEED_SECONDS s)"
report sign
echo "           (saturation, $CONNECTIONS connections; offer $SIGN_OFFER under rules, historySource apple; each answer must be $SIGN_STATUS)"
report retention
echo "           (fixed load: $RETENTION_RATE requests/s offered, $RETENTION_CONNECTIONS connections)"
echo "App Store Server API lookups (must be none): $(grep -c '^app_store_server_api_lookups_total' "$WORK/metrics.txt" || true)"
grep -E '^retention_(requests|fallbacks)_total|^http_requests_total\{route="/v1/apple/retention"' "$WORK/metrics.txt" | sed 's/^/  /' || true
SIGN_ANSWERS=$(grep -E '^http_requests_total\{.*route="/v1/offers/signatures"' "$WORK/metrics.txt" || true)
[ -z "$SIGN_ANSWERS" ] || echo "$SIGN_ANSWERS" | sed 's/^/  /'
# Every signing answer must be the one the decision gives: a 503 (a lock or commit that timed out)
# is not a refusal.
OTHER_ANSWERS=$(echo "$SIGN_ANSWERS" | { grep -v "status=\"$SIGN_STATUS\"" || true; } | awk 'NF { total += $NF } END { print total + 0 }')
[ "$OTHER_ANSWERS" = 0 ] && echo "every signing answer $SIGN_STATUS: PASS" || echo "every signing answer $SIGN_STATUS: MISS ($OTHER_ANSWERS others)"
SIGN_RPS=$(field "$WORK/sign.txt" rps)
RETENTION_P99=$(field "$WORK/retention.txt" p99_ms)
if [ "$SIGN_STATUS" = 201 ]; then
    awk -v r="$SIGN_RPS" 'BEGIN { exit !(r >= 5000) }' && echo "goal >= 5,000 signatures/s: PASS ($SIGN_RPS)" || echo "goal >= 5,000 signatures/s: MISS ($SIGN_RPS)"
fi
awk -v p="$RETENTION_P99" 'BEGIN { exit !(p <= 10) }' && echo "goal retention p99 <= 10 ms at $RETENTION_RATE/s: PASS ($RETENTION_P99 ms)" \
    || echo "goal retention p99 <= 10 ms at $RETENTION_RATE/s: MISS ($RETENTION_P99 ms)"
