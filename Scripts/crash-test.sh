#!/usr/bin/env bash
# Crash test: SIGKILL the server under signing load, again and again, and check that nothing a
# client received is missing from the audit log.
#
# Builds the release binary (the same command as Scripts/benchmark.sh and the Dockerfile), sets
# up ONE throw-away store (master key, development key, API client) and runs TRIALS trials on it,
# so the audit chain grows across every crash. Each trial: start `offer-signer serve`, drive
# POST /v1/offers/signatures from CONNECTIONS keep-alive connections (Scripts/crash-test.py,
# Python 3 standard library; every nonce received in a 201 is appended to a file and flushed
# before the next request), `kill -9` the server KILL_MIN..KILL_MAX seconds after the load
# starts (uniformly random), then, with the server dead, check that every nonce ever received
# is in the ledger and in exactly one `signature.issued` audit record, that no nonce is audited
# twice, and that `offer-signer audit verify` passes. The run stops at the first failing trial.
#
# Usage:   Scripts/crash-test.sh
# Env:     TRIALS=200  CONNECTIONS=16  PORT=18191  FORMATS=legacy,jws (or legacy, or jws)
#          KILL_MIN=0.2 KILL_MAX=1.5 (seconds after the load starts)
#          MAX_SECONDS=3600 (the whole run; past it the run stops and fails)
#          SEED=N (repeat a run's kill times)  KEEP=1 (keep the store and logs; printed at the end)
#          SKIP_BUILD=1 (use the existing .build/release/offer-signer)
#          OFFER_SIGNER_BIN=path (test that binary instead; no build)
# Needs:   openssl, python3.
# Exit:    0 when every received signature is audited exactly once and the chain is intact;
#          1 on any loss, duplicate, non-201 answer or broken chain; 2 on bad setup.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/opt/swift/usr/bin:$PATH

TRIALS=${TRIALS:-200}
CONNECTIONS=${CONNECTIONS:-16}
PORT=${PORT:-18191}
FORMATS=${FORMATS:-legacy,jws}
KILL_MIN=${KILL_MIN:-0.2}
KILL_MAX=${KILL_MAX:-1.5}
MAX_SECONDS=${MAX_SECONDS:-3600}
for setting in TRIALS CONNECTIONS PORT MAX_SECONDS; do
    case "${!setting}" in
        '' | *[!0-9]*) echo "error: $setting='${!setting}' is not a whole number" >&2; exit 2 ;;
    esac
done
case "$FORMATS" in
    legacy | jws | legacy,jws | jws,legacy) ;;
    *) echo "error: FORMATS='$FORMATS' must be legacy, jws or legacy,jws" >&2; exit 2 ;;
esac

for tool in openssl python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: '$tool' is not installed. Install it with: apt-get install -y $tool" >&2
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

# --- One throw-away store for every trial ----------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-crash.XXXXXX")
cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then
        echo "kept: $WORK (store, server log, received nonces)"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

STORE="$WORK/offer-signer.sqlite"
MASTER="$WORK/master.key"
KEY="$WORK/AuthKey_CRASH00001.p8"
(umask 077 && openssl rand -base64 32 > "$MASTER")
chmod 600 "$MASTER"

"$BIN" keys generate --key-id CRASH00001 --output "$KEY" 2>/dev/null
"$BIN" keys import --store "$STORE" --master-key-file "$MASTER" \
    --key-id CRASH00001 --bundle-id com.example.crash \
    --issuer-id "$(python3 -c 'import uuid; print(uuid.uuid4())')" --file "$KEY" \
    --development --actor crash-test --reason "crash test run" >/dev/null
CLIENT_JSON=$("$BIN" clients create --store "$STORE" --master-key-file "$MASTER" --name crash --bundle-id com.example.crash --json --actor crash-test)
SECRET=$(printf '%s' "$CLIENT_JSON" | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')

echo "==> $TRIALS trials: serve, $CONNECTIONS connections signing ($FORMATS), kill -9 after ${KILL_MIN}-${KILL_MAX} s, check"
STATUS=0
OFFER_SIGNER_CRASH_SECRET="$SECRET" python3 Scripts/crash-test.py --bin "$BIN" --store "$STORE" --master-key-file "$MASTER" \
    --work "$WORK" --trials "$TRIALS" --connections "$CONNECTIONS" --port "$PORT" --formats "$FORMATS" \
    --kill-min "$KILL_MIN" --kill-max "$KILL_MAX" --max-seconds "$MAX_SECONDS" ${SEED:+--seed "$SEED"} || STATUS=$?
if [ "$STATUS" != 0 ]; then
    echo "server log (last lines):" >&2
    tail -n 20 "$WORK/server.log" >&2 || true
fi
exit "$STATUS"
