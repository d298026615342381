#!/usr/bin/env bash
# The operator's dashboard (/admin) on a large store: each page's latency, alone and while wrk
# drives POST /v1/offers/signatures, and signing's throughput with and without the dashboard
# being polled.
#
# Sets up a throw-away SQLite store with a development key, an API client and an admin token,
# fills it with N issuances spread over the last 120 days (20 offers, 8,192 customers), N/20
# redemptions (three in four matched to an issuance, the others signed elsewhere or without a
# token) and N/10 App Store Server Notifications over the last 30 days, then starts `serve
# --admin-token-file` and measures:
#   1. each page alone: the median and the slowest of PAGE_REPEATS fetches;
#   2. signing alone: wrk for DURATION seconds (requests/s, p99);
#   3. signing while a poller fetches every page in turn, POLL_INTERVAL seconds apart (someone
#      clicking through the dashboard; 0: back to back, a worst case no browser produces, as the
#      pages have no script and never refresh themselves), for the same DURATION: signing's
#      requests/s and p99, and each page's median and slowest fetch.
# It prints a table with the issue's goals (each page within 1 s while signing runs; signing's
# throughput within 5% of the run without the dashboard) marked PASS or MISS.
#
# The filler writes ledger, redemption and notification rows (and the ledger's daily roll-up) straight into the store's tables
# (a million signing requests through HTTP would take most of an hour); it writes no audit
# records for them, so this store's audit chain does not cover them (the dashboard's queries do
# not read the audit log). Never run it against a store you keep.
#
# Usage:   Scripts/benchmark-dashboard.sh [N]        (N issuances, default 1,000,000)
# Env:     DURATION=20 (seconds per wrk run)  CONNECTIONS=64  THREADS=2  PORT=18191
#          PAGE_REPEATS=5  WARMUP=3 (seconds)  POLL_INTERVAL=1 (seconds between page fetches)
#          SKIP_BUILD=1 (use the existing .build/release/offer-signer)
#          OFFER_SIGNER_BIN=path (benchmark that binary instead; no build)
# Needs:   wrk, curl, openssl, python3 (with its sqlite3 module).
# Exit:    0 when every page and every signing request answered 2xx; 1 otherwise (a MISS of a
#          goal is reported, not an error: the machine may be busy).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/opt/swift/usr/bin:$PATH

N=${1:-1000000}
DURATION=${DURATION:-20}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
PORT=${PORT:-18191}
PAGE_REPEATS=${PAGE_REPEATS:-5}
WARMUP=${WARMUP:-3}
POLL_INTERVAL=${POLL_INTERVAL:-1}
for name in N DURATION CONNECTIONS THREADS PORT PAGE_REPEATS WARMUP POLL_INTERVAL; do
    case "${!name}" in
        '' | *[!0-9]*) echo "error: $name='${!name}' is not a whole number" >&2; exit 2 ;;
    esac
done
for tool in wrk curl openssl python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is not installed (apt-get install -y $tool)" >&2; exit 2; }
done

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

WORK=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-dashboard-bench.XXXXXX")
SERVER_PID=
POLLER_PID=
cleanup() {
    for pid in "$POLLER_PID" "$SERVER_PID"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

STORE="$WORK/offer-signer.sqlite"
MASTER="$WORK/master.key"
ADMIN="$WORK/admin.token"
KEY="$WORK/AuthKey_BENCH00001.p8"
(umask 077 && openssl rand -base64 32 > "$MASTER" && openssl rand -hex 24 > "$ADMIN")
chmod 600 "$MASTER" "$ADMIN"
ADMIN_TOKEN=$(cat "$ADMIN")

"$BIN" keys generate --key-id BENCH00001 --output "$KEY" 2>/dev/null
"$BIN" keys import --store "$STORE" --master-key-file "$MASTER" --key-id BENCH00001 --bundle-id com.example.bench \
    --issuer-id "$(python3 -c 'import uuid; print(uuid.uuid4())')" --file "$KEY" --development --actor benchmark --reason "dashboard benchmark"
CLIENT_JSON=$("$BIN" clients create --store "$STORE" --master-key-file "$MASTER" --name bench --bundle-id com.example.bench --json --actor benchmark)
SECRET=$(printf '%s' "$CLIENT_JSON" | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')

# --- Fill ------------------------------------------------------------------------------
echo "==> filling the store: $N issuances over 120 days, $((N / 20)) redemptions, $((N / 10)) notifications"
FILL_START=$(date +%s.%N)
python3 - "$STORE" "$N" <<'PY'
import random, sqlite3, sys, time, uuid
path, n = sys.argv[1], int(sys.argv[2])
random.seed(33)
db = sqlite3.connect(path)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=OFF")
now = int(time.time() * 1000)
day = 86_400_000
offers = [f"BENCH_OFFER_{i:02d}" for i in range(20)]
tokens = [str(uuid.UUID(int=random.getrandbits(128), version=4)) for _ in range(8192)]
issued = []  # (token, offer, issued_at) of a sample, to match redemptions to
batch = []
for i in range(n):
    at = now - int(random.random() ** 1.5 * 120 * day)  # more recent days are busier
    token, offer = random.choice(tokens), random.choice(offers)
    batch.append((f"fill-{i:09d}", 0, at, "client:bench", "com.example.bench", "com.example.bench.monthly", offer, token, "BENCH00001", "legacy"))
    if i % 20 == 0:
        issued.append((token, offer, at))
    if len(batch) == 50_000:
        db.executemany("INSERT INTO issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format) VALUES (?,?,?,?,?,?,?,?,?,?)", batch)
        db.commit()
        batch = []
if batch:
    db.executemany("INSERT INTO issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format) VALUES (?,?,?,?,?,?,?,?,?,?)", batch)
redemptions = []
for j, (token, offer, at) in enumerate(issued):
    kind = j % 4
    purchase = min(now, at + random.randint(60_000, 3 * day))
    matched = kind < 3
    redemptions.append(("com.example.bench", "Production", f"7{j:011d}", f"6{j:011d}", "com.example.bench.monthly", offer,
                        token if kind != 3 or j % 8 == 3 else None, purchase, 1 if matched else None, at if matched else None, "notification", purchase))
db.executemany("INSERT INTO offer_redemptions (bundle_id, environment, transaction_id, original_transaction_id, product_id, offer_id, app_account_token, purchase_date, issuance_seq, signature_issued_at, source, recorded_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", redemptions)
types = ["DID_RENEW"] * 12 + ["SUBSCRIBED", "OFFER_REDEEMED", "DID_CHANGE_RENEWAL_STATUS", "EXPIRED", "DID_FAIL_TO_RENEW", "REFUND"]
notifications = []
for k in range(n // 10):
    at = now - int(random.random() * 30 * day)
    notifications.append((str(uuid.uuid4()), "com.example.bench", "Production" if k % 50 else "Sandbox", random.choice(types), None, f"6{k:011d}", at, at))
db.executemany("INSERT INTO apple_notifications (notification_uuid, bundle_id, environment, notification_type, subtype, original_transaction_id, signed_date, received_at) VALUES (?,?,?,?,?,?,?,?)", notifications)
# The daily roll-up the server keeps in each group commit (IssuanceRollUp), counted here as the
# migration that created it counts it (the filler bypasses the group commit).
db.execute("""INSERT INTO offer_issuance_days (day, bundle_id, offer_id, client, issued, last_issued_at)
    SELECT issued_at / 86400000, bundle_id, offer_id, client,
        COUNT(DISTINCT client || '|' || COALESCE(app_account_token, '') || '|' || product_id || '|' || offer_id || '|' || CAST(issued_at AS TEXT)), MAX(issued_at)
    FROM issued_signatures GROUP BY issued_at / 86400000, bundle_id, offer_id, client""")
db.commit()
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.close()
PY
FILL_END=$(date +%s.%N)
echo "    filled in $(awk -v a="$FILL_START" -v b="$FILL_END" 'BEGIN { printf "%.1f", b - a }') s; store $(du -h "$STORE" | cut -f1)"

# --- Server ------------------------------------------------------------------------------
"$BIN" serve --store "$STORE" --master-key-file "$MASTER" --admin-token-file "$ADMIN" --port "$PORT" \
    --log-level warning --client-rate 0 --token-rate 0 > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 300); do
    curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "error: the server exited; its log:" >&2; cat "$WORK/server.log" >&2; exit 1; }
    sleep 0.1
done
curl -fsS "$URL/readyz" >/dev/null || { echo "error: $URL/readyz never answered 200" >&2; cat "$WORK/server.log" >&2; exit 1; }

PAGES=(/admin/offers "/admin/offers?days=90" /admin/retention /admin/apple /admin/keys /admin/clients)
FAILED=0
# fetch PATH: prints the seconds the page took; counts a non-200 as a failure.
fetch() {
    local out
    out=$(curl -sS -o /dev/null -w '%{http_code} %{time_total}' -H "Authorization: Bearer $ADMIN_TOKEN" "$URL$1")
    [ "${out%% *}" = 200 ] || { echo "error: $1 answered ${out%% *}" >&2; return 1; }
    echo "${out##* }"
}
# summary FILE: "median max" of the seconds in FILE, in ms.
summary() { sort -n "$1" | awk '{ v[NR] = $1 } END { if (NR == 0) { print "- -"; exit } printf "%.0f %.0f", v[int((NR + 1) / 2)] * 1000, v[NR] * 1000 }'; }

echo "==> each page alone ($PAGE_REPEATS fetches)"
for page in "${PAGES[@]}"; do
    name=$(printf '%s' "$page" | tr -c 'a-z0-9' '_')
    : > "$WORK/alone-$name.txt"
    for _ in $(seq 1 "$PAGE_REPEATS"); do fetch "$page" >> "$WORK/alone-$name.txt" || FAILED=1; done
done

export OFFER_SIGNER_BENCH_SECRET="$SECRET" OFFER_SIGNER_BENCH_FORMATS=legacy OFFER_SIGNER_BENCH_THINK_MS=0 OFFER_SIGNER_BENCH_RATE=0 OFFER_SIGNER_BENCH_THREADS="$THREADS"
LUA="Scripts/benchmark-signatures.lua"
STATUS=$(curl -sS -o "$WORK/first.json" -w '%{http_code}' -X POST "$URL/v1/offers/signatures" -H 'Content-Type: application/json' -H "Authorization: Bearer $SECRET" \
    -d "{\"productID\":\"com.example.bench.monthly\",\"offerID\":\"BENCH_OFFER\",\"appAccountToken\":\"$(python3 -c 'import uuid; print(uuid.uuid4())')\"}")
[ "$STATUS" = 201 ] || { echo "error: a single signing request answered $STATUS:" >&2; cat "$WORK/first.json" >&2; exit 1; }
wrk -t"$THREADS" -c"$CONNECTIONS" -d"${WARMUP}s" -s "$LUA" "$URL/v1/offers/signatures" >/dev/null
field_of() { grep '^BENCH ' "$2" | grep -o "$1=[^ ]*" | head -n 1 | cut -d= -f2; }

echo "==> signing alone: wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s"
wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$LUA" "$URL/v1/offers/signatures" > "$WORK/wrk-alone.txt"
grep '^BENCH' "$WORK/wrk-alone.txt"

echo "==> signing while the dashboard is polled (every page in turn, ${POLL_INTERVAL} s apart)"
(
    while :; do
        for page in "${PAGES[@]}"; do
            name=$(printf '%s' "$page" | tr -c 'a-z0-9' '_')
            fetch "$page" >> "$WORK/loaded-$name.txt" || echo failed >> "$WORK/poll-failures.txt"
            sleep "$POLL_INTERVAL"
        done
    done
) &
POLLER_PID=$!
wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$LUA" "$URL/v1/offers/signatures" > "$WORK/wrk-polled.txt"
kill "$POLLER_PID" 2>/dev/null || true
wait "$POLLER_PID" 2>/dev/null || true
POLLER_PID=
grep '^BENCH' "$WORK/wrk-polled.txt"
[ -s "$WORK/poll-failures.txt" ] && { echo "error: $(wc -l < "$WORK/poll-failures.txt") page fetches failed under load" >&2; FAILED=1; }

# --- Report -------------------------------------------------------------------------------
ALONE_RPS=$(field_of rps "$WORK/wrk-alone.txt")
POLLED_RPS=$(field_of rps "$WORK/wrk-polled.txt")
for run in alone polled; do
    non2xx=$(field_of non2xx "$WORK/wrk-$run.txt")
    [ "${non2xx:-0}" = 0 ] || { echo "error: $non2xx signing requests were not 2xx ($run)" >&2; FAILED=1; }
done
echo
echo "Dashboard on $N issuances (SQLite), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
printf '%-24s %14s %14s %16s %16s %6s\n' page "alone p50 ms" "alone max ms" "signing p50 ms" "signing max ms" "goal"
for page in "${PAGES[@]}"; do
    name=$(printf '%s' "$page" | tr -c 'a-z0-9' '_')
    read -r alone_p50 alone_max <<< "$(summary "$WORK/alone-$name.txt")"
    if [ -s "$WORK/loaded-$name.txt" ]; then read -r loaded_p50 loaded_max <<< "$(summary "$WORK/loaded-$name.txt")"; else loaded_p50=-; loaded_max=-; fi
    goal=MISS
    [ "$loaded_max" != - ] && [ "$loaded_max" -le 1000 ] && goal=PASS
    printf '%-24s %14s %14s %16s %16s %6s\n' "$page" "$alone_p50" "$alone_max" "$loaded_p50" "$loaded_max" "$goal"
done
RATIO=$(awk -v a="$ALONE_RPS" -v b="$POLLED_RPS" 'BEGIN { printf "%.3f", (a > 0 ? b / a : 0) }')
GOAL=$(awk -v r="$RATIO" 'BEGIN { print (r >= 0.95 ? "PASS" : "MISS") }')
printf 'signing alone %s requests/s (p99 %s ms); while polled (a page every %s s) %s requests/s (p99 %s ms): %s of alone, goal >= 0.95: %s\n' \
    "$ALONE_RPS" "$(field_of p99_ms "$WORK/wrk-alone.txt")" "$POLL_INTERVAL" "$POLLED_RPS" "$(field_of p99_ms "$WORK/wrk-polled.txt")" "$RATIO" "$GOAL"
exit "$FAILED"
