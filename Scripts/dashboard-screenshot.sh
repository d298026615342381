#!/usr/bin/env bash
# Renders every /admin page of a server filled through its real endpoints with headless Chromium,
# to PNG, and fails when a page is wrong (Docs/Operations.md, "Dashboard screenshots").
#
# A server on loopback with a temporary SQLite store, an admin token file and an offers catalog
# is filled with: signatures (POST /v1/offers/signatures); App Store Server Notifications V2 for
# six customers, signed by a throw-away chain shaped like Apple's whose root the server is given
# (--apple-root, as Scripts/benchmark-stored-history.sh does), with redemptions (two matched to our
# signatures, one with an appAccountToken nothing of ours signed); a Retention Messaging request;
# a key rotation through the CLI (keys import + keys activate while serving), then more signatures.
# Chromium cannot send headers, so a Python proxy on loopback adds the admin bearer token (never in
# a URL). Each page must answer 200 with <main data-page="NAME">, the chart pages an inline
# <svg class="chart"> drawing data marks, no secret of the run may appear in it, and its PNG must
# not be blank (more than a few distinct colours).
#
# Usage:   Scripts/dashboard-screenshot.sh [OUTDIR]     (default .build/dashboard-screenshots)
# Env:     BIN=.build/release/offer-signer  PORT=18291  CHROMIUM=chromium
# Needs:   chromium (Debian's), curl, openssl, python3 with the `cryptography` package.
# Exit:    0 when every page passed; 1 naming the page and what is wrong; 2 when a tool is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUTDIR=${1:-.build/dashboard-screenshots}
BIN=${BIN:-.build/release/offer-signer}
PORT=${PORT:-18291}
CHROMIUM=${CHROMIUM:-chromium}
TOOLS=Scripts/dashboard_screenshot_tools.py
BUNDLE=com.example.bench
APP_APPLE_ID=1234567890
# page name, path, whether the page must show a chart (1) or may have none (0).
PAGES=(
    "offers /admin/offers?days=30 1"
    "offers-90 /admin/offers?days=90 1"
    "retention /admin/retention 1"
    "apple /admin/apple 1"
    "keys /admin/keys 1"
    "clients /admin/clients 0"
)

for tool in "$CHROMIUM" curl openssl python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is not installed (apt-get install -y $tool)" >&2; exit 2; }
done
python3 -c 'import cryptography' 2>/dev/null || { echo "error: python3 lacks the 'cryptography' package (apt-get install -y python3-cryptography)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "error: $BIN not found; build it (swift build -c release --product offer-signer) or set BIN" >&2; exit 2; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-screenshots.XXXXXX")
SERVER_PID=
PROXY_PID=
cleanup() {
    for pid in "$PROXY_PID" "$SERVER_PID"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then
    echo "error: something already answers on port $PORT; stop it or set PORT" >&2
    exit 2
fi

# --- Chain, store, key, client, catalog, tokens ----------------------------------------
python3 Scripts/stored-history-fixtures.py chain "$WORK/chain.json" "$WORK/root.pem"
STORE="$WORK/offer-signer.sqlite"
MASTER="$WORK/master.key"
S=(--store "$STORE" --master-key-file "$MASTER")
(umask 077 && openssl rand -base64 32 > "$MASTER")
ISSUER=$(python3 -c 'import uuid; print(uuid.uuid4())')
"$BIN" keys generate --key-id SHOTKEY001 --output "$WORK/AuthKey_SHOTKEY001.p8" >/dev/null 2>&1
"$BIN" keys import "${S[@]}" --key-id SHOTKEY001 --bundle-id "$BUNDLE" --issuer-id "$ISSUER" --file "$WORK/AuthKey_SHOTKEY001.p8" \
    --development --actor screenshots --reason "first key" >/dev/null
SECRET=$("$BIN" clients create "${S[@]}" --name app-backend --bundle-id "$BUNDLE" --json --actor screenshots \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')
"$BIN" clients create "${S[@]}" --name analytics --bundle-id "$BUNDLE" --json --actor screenshots >/dev/null
# Apple's API points at a closed port: every decision comes from the stored history.
cat > "$WORK/offers.json" <<JSON
{"apps": {"$BUNDLE": {"appAppleID": $APP_APPLE_ID, "environments": ["Production"], "notificationHistory": true,
          "appStoreServerAPI": {"productionURL": "http://127.0.0.1:9/closed"},
          "retention": {"products": {"com.example.bench.monthly": {
              "offers": [{"offerID": "RETAIN", "messageIdentifier": "6f1d4c3e-0000-4000-8000-000000000001"}],
              "fallback": {"message": {"messageIdentifier": "6f1d4c3e-0000-4000-8000-000000000002"}}}}}}},
 "offers": [
  {"offerID": "WINBACK50", "bundleID": "$BUNDLE", "productIDs": ["com.example.bench.monthly"], "subscriptionGroupID": "BENCHGROUP", "kind": "win-back"},
  {"offerID": "SPRING20", "bundleID": "$BUNDLE", "productIDs": ["com.example.bench.monthly"], "subscriptionGroupID": "BENCHGROUP", "kind": "win-back"},
  {"offerID": "RETAIN", "bundleID": "$BUNDLE", "productIDs": ["com.example.bench.monthly"], "subscriptionGroupID": "BENCHGROUP",
   "kind": "retention", "historySource": "apple", "rules": {"minPaidMonths": 3}}]}
JSON
for name in operator admin; do
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/$name-token")
done

# --- Serve --------------------------------------------------------------------------------
"$BIN" serve "${S[@]}" --operator-token-file "$WORK/operator-token" --admin-token-file "$WORK/admin-token" --port "$PORT" \
    --offers "$WORK/offers.json" --apple-root "$WORK/root.pem" --log-level warning > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 200); do
    curl -fsS "$URL/readyz" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "error: the server exited:" >&2; cat "$WORK/server.log" >&2; exit 1; }
    sleep 0.1
done
curl -fsS "$URL/readyz" >/dev/null || { echo "error: the server did not become ready:" >&2; cat "$WORK/server.log" >&2; exit 1; }

# --- Fill through the real endpoints, rotate the key, fill again -------------------------
echo "==> filling the store through the endpoints"
python3 "$TOOLS" fill "$URL" "$WORK/chain.json" "$SECRET" "$BUNDLE" "$APP_APPLE_ID" before-rotation
echo "==> rotating the key with the CLI while serving"
"$BIN" keys generate --key-id SHOTKEY002 --output "$WORK/AuthKey_SHOTKEY002.p8" >/dev/null 2>&1
"$BIN" keys import "${S[@]}" --key-id SHOTKEY002 --bundle-id "$BUNDLE" --issuer-id "$ISSUER" --file "$WORK/AuthKey_SHOTKEY002.p8" \
    --development --actor screenshots --reason "rotation" >/dev/null
"$BIN" keys activate SHOTKEY002 "${S[@]}" --bundle-id "$BUNDLE" --actor screenshots --reason rotation >/dev/null
# The server reads the registry every second; sign once the new key is in force.
for _ in $(seq 1 50); do
    curl -fsS -H "Authorization: Bearer $(cat "$WORK/operator-token")" "$URL/metrics" | grep -q 'key_id="SHOTKEY002"' && break
    curl -fsS -o /dev/null -X POST "$URL/v1/offers/signatures" -H 'Content-Type: application/json' -H "Authorization: Bearer $SECRET" \
        -d '{"productID":"com.example.bench.monthly","offerID":"WINBACK50","appAccountToken":"00000000-0000-4000-8000-00000000ffff","formats":["legacy"]}'
    sleep 0.2
done
python3 "$TOOLS" fill "$URL" "$WORK/chain.json" "$SECRET" "$BUNDLE" "$APP_APPLE_ID" after-rotation
echo "==> audit verify (the keys page shows when it last passed)"
"$BIN" audit verify "${S[@]}" | tail -n 1

# --- The proxy that adds the admin token --------------------------------------------------
python3 "$TOOLS" proxy "$URL" "$WORK/admin-token" "$WORK/proxy-port" 2> "$WORK/proxy.log" &
PROXY_PID=$!
for _ in $(seq 1 100); do
    [ -s "$WORK/proxy-port" ] && break
    kill -0 "$PROXY_PID" 2>/dev/null || { echo "error: the proxy exited:" >&2; cat "$WORK/proxy.log" >&2; exit 1; }
    sleep 0.1
done
[ -s "$WORK/proxy-port" ] || { echo "error: the proxy did not start" >&2; exit 1; }
PROXY="http://127.0.0.1:$(cat "$WORK/proxy-port")"

# Without the token the pages are refused (the proxy is what opens them).
STATUS=$(curl -sS -o /dev/null -w '%{http_code}' "$URL/admin/offers")
[ "$STATUS" = 401 ] || { echo "error: /admin/offers without the admin token answered $STATUS, not 401" >&2; exit 1; }

# --- Every page: HTML checks, then Chromium -------------------------------------------------
FAILED=0
for entry in "${PAGES[@]}"; do
    read -r name path needs_chart <<< "$entry"
    page=${path#/admin/}
    page=${page%%\?*}
    STATUS=$(curl -sS -o "$WORK/$name.html" -w '%{http_code}' "$PROXY$path")
    if [ "$STATUS" != 200 ]; then
        echo "error: $path answered $STATUS, not 200: $(head -c 300 "$WORK/$name.html")" >&2
        FAILED=1
        continue
    fi
    python3 "$TOOLS" check-page "$WORK/$name.html" "$page" "$needs_chart" || { FAILED=1; continue; }
    for secret in "$SECRET" "$(cat "$WORK/admin-token")" "$(cat "$WORK/operator-token")" "$(cat "$MASTER")"; do
        if grep -qF -- "$secret" "$WORK/$name.html"; then
            echo "error: $path shows a secret (an API client secret, a token or the master key)" >&2
            FAILED=1
        fi
    done
    rm -f "$OUTDIR/$name.png"
    "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$OUTDIR/$name.png" --window-size=1280,2000 \
        "$PROXY$path" > "$WORK/chromium-$name.log" 2>&1 || true
    if [ ! -s "$OUTDIR/$name.png" ]; then
        echo "error: Chromium wrote no screenshot of $path:" >&2
        tail -n 5 "$WORK/chromium-$name.log" >&2
        FAILED=1
        continue
    fi
    python3 "$TOOLS" check-png "$OUTDIR/$name.png" || FAILED=1
done

if [ "$FAILED" != 0 ]; then
    echo "dashboard screenshots: FAILED (see above; server log follows)" >&2
    tail -n 20 "$WORK/server.log" >&2
    exit 1
fi
echo "dashboard screenshots: every page passed; PNGs in $OUTDIR"
