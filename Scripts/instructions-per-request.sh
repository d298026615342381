#!/usr/bin/env bash
# Instructions the server executes per request, counted by valgrind's callgrind: deterministic
# on a busy or virtual machine (no hardware counters needed), so two builds can be compared
# while others use the cores. Not a speed: a build that executes fewer instructions can still
# wait more (locks, syscalls, the audit's fsync).
#
# Starts `offer-signer serve` under callgrind on a throw-away SQLite store (development key, one
# API client, rate limits off), sends WARMUP requests uninstrumented, then counts the server's
# instructions (every thread, the audit writer and background tasks included) while
# CLIENTS keep-alive connections send REQUESTS requests in all, and prints the total divided by
# REQUESTS. The profile is kept for `callgrind_annotate --inclusive=yes` (per-function costs).
#
# Usage:   Scripts/instructions-per-request.sh BINARY [OUTPUT]   (OUTPUT: callgrind.out.requests)
# Env:     REQUESTS=2000  CLIENTS=16  WARMUP=400  PORT=18787
#          ROUTE=signatures (POST /v1/offers/signatures with an API key, legacy format, a random
#          appAccountToken per request) or healthz (GET /healthz: the HTTP floor)
# Needs:   valgrind, python3, curl, openssl. Valgrind 3.19 cannot read the DWARF 5 of Swift's
#          shared runtime, so the binary must be linked with --static-swift-stdlib (as
#          Scripts/benchmark.sh and the Dockerfile build it); its debug info is stripped into a
#          copy first (callgrind then names functions from the symbol table).
set -euo pipefail

BIN=${1:?usage: $0 BINARY [OUTPUT]}
OUT=${2:-callgrind.out.requests}
REQUESTS=${REQUESTS:-2000}
CLIENTS=${CLIENTS:-16}
WARMUP=${WARMUP:-400}
PORT=${PORT:-18787}
ROUTE=${ROUTE:-signatures}
case "$ROUTE" in
    signatures | healthz) ;;
    *) echo "error: ROUTE='$ROUTE' is not signatures or healthz" >&2; exit 2 ;;
esac
for tool in valgrind callgrind_control python3 curl openssl objcopy; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is not installed" >&2; exit 2; }
done
if ldd "$BIN" 2>/dev/null | grep -q libswiftCore; then
    echo "error: $BIN links the Swift runtime dynamically; build it with --static-swift-stdlib" >&2
    exit 2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-instructions.XXXXXX")
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

objcopy --strip-debug "$BIN" "$WORK/offer-signer"
STORE="$WORK/store.sqlite"
MASTER="$WORK/master.key"
(umask 077 && openssl rand -base64 32 > "$MASTER")
"$BIN" keys generate --key-id COUNT00001 --output "$WORK/key.p8" 2>/dev/null
"$BIN" keys import --store "$STORE" --master-key-file "$MASTER" --key-id COUNT00001 --bundle-id com.example.count \
    --issuer-id 6b29fc40-ca47-1067-b31d-00dd010662da --file "$WORK/key.p8" --development --actor count --reason "instruction count" >/dev/null
SECRET=$("$BIN" clients create --store "$STORE" --master-key-file "$MASTER" --name count --bundle-id com.example.count --json --actor count |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')

valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/callgrind.out" \
    "$WORK/offer-signer" serve --store "$STORE" --master-key-file "$MASTER" --port "$PORT" \
    --log-level warning --client-rate 0 --token-rate 0 > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 600); do
    curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "error: the server exited; its log:" >&2; cat "$WORK/server.log" >&2; exit 1; }
    sleep 0.5
done

# drive COUNT: COUNT requests over CLIENTS keep-alive connections; exits non-zero on any other status.
drive() {
    python3 - "$PORT" "$SECRET" "$1" "$CLIENTS" "$ROUTE" <<'PY'
import http.client, json, sys, threading, uuid
port, secret, total, clients, route = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
failures = []
def client(count):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for _ in range(count):
        if route == "healthz":
            connection.request("GET", "/healthz")
            expected = 200
        else:
            body = json.dumps({"productID": "com.example.count.monthly", "offerID": "COUNT_OFFER", "appAccountToken": str(uuid.uuid4())})
            connection.request("POST", "/v1/offers/signatures", body=body,
                               headers={"Content-Type": "application/json", "Authorization": "Bearer " + secret})
            expected = 201
        response = connection.getresponse()
        response.read()
        if response.status != expected:
            failures.append(response.status)
threads = [threading.Thread(target=client, args=(total // clients + (1 if i < total % clients else 0),)) for i in range(clients)]
for thread in threads: thread.start()
for thread in threads: thread.join()
if failures:
    sys.exit(f"{len(failures)} requests answered {sorted(set(failures))}")
PY
}

drive "$WARMUP"
callgrind_control --instr=on "$SERVER_PID" >/dev/null 2>&1
drive "$REQUESTS"
callgrind_control --instr=off "$SERVER_PID" >/dev/null 2>&1
callgrind_control --dump "$SERVER_PID" >/dev/null 2>&1
sleep 1
kill "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=

# The dump made on request holds the counted part; the one written at exit holds nothing more.
TOTAL=$(cat "$WORK"/callgrind.out* | awk '/^totals:/ { total += $2 } END { print total + 0 }')
cp "$WORK/callgrind.out.1" "$OUT"
echo "route $ROUTE: $REQUESTS requests over $CLIENTS connections after $WARMUP uninstrumented"
echo "instructions: $TOTAL in all, $(( TOTAL / REQUESTS )) per request (profile: $OUT)"
