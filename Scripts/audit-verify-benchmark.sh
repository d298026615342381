#!/usr/bin/env bash
# Measures `offer-signer audit verify` on a store holding N (default 1,000,000) valid chained
# audit records, in release mode.
#
#   Scripts/audit-verify-benchmark.sh [N]
#
# The store is created by the real CLI (schema and first record), then filled with records
# that follow the chain rule of AuditChain (SHA-256 over "previousHash\nsequence\nrecordedAt\nkind\n"
# + body) in one transaction with one prepared statement (Python's sqlite3), then a signed
# checkpoint is made and exported, and `audit verify --checkpoints` is timed.
set -euo pipefail
N="${1:-1000000}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
swift build -c release --product offer-signer >&2
BIN="$(swift build -c release --show-bin-path)/offer-signer"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
umask 077
openssl rand -base64 32 > "$WORK/master.key"
"$BIN" keys generate --key-id BENCHKEY01 --output "$WORK/key.p8" >/dev/null 2>&1
"$BIN" keys import --store "$WORK/store.sqlite" --master-key-file "$WORK/master.key" \
    --key-id BENCHKEY01 --bundle-id com.example.app --file "$WORK/key.p8" --development --actor benchmark >/dev/null

echo "filling the store with $N audit records…" >&2
python3 - "$WORK/store.sqlite" "$N" <<'PY'
import hashlib, sqlite3, sys, time, uuid
path, total = sys.argv[1], int(sys.argv[2])
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")
seq, prev = db.execute("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
start_ms = int(time.time() * 1000)
kind = "signature.issued"
def rows():
    global seq, prev
    for i in range(total - seq):
        seq += 1
        ms = start_ms + i // 50
        body = ('{"issuedAt":%d,"client":"load","bundleID":"com.example.app","productID":"pro.monthly",'
                '"offerID":"WINBACK50","appAccountToken":"%s","keyID":"BENCHKEY01","nonce":"%s","format":"legacy"}'
                % (ms, uuid.UUID(int=i), uuid.UUID(int=i + (1 << 64))))
        h = hashlib.sha256(("%s\n%d\n%d\n%s\n" % (prev, seq, ms, kind)).encode() + body.encode()).hexdigest()
        yield (seq, ms, kind, body, prev, h)
        prev = h
db.execute("BEGIN")
db.executemany("INSERT INTO audit_log (seq, recorded_at, kind, body, previous_hash, hash) VALUES (?, ?, ?, ?, ?, ?)", rows())
db.execute("COMMIT")
db.close()
PY
"$BIN" audit checkpoints create --store "$WORK/store.sqlite" --master-key-file "$WORK/master.key" >&2
"$BIN" audit checkpoints export --store "$WORK/store.sqlite" --output "$WORK/checkpoints.jsonl" 2>/dev/null
RECORDS="$(sqlite3 "$WORK/store.sqlite" 'SELECT COUNT(*) FROM audit_log' 2>/dev/null || echo "$N+")"
echo "timing: offer-signer audit verify --store STORE --checkpoints FILE ($RECORDS records)" >&2
START=$(date +%s.%N)
"$BIN" audit verify --store "$WORK/store.sqlite" --checkpoints "$WORK/checkpoints.jsonl"
END=$(date +%s.%N)
printf 'audit verify: %s records in %.2f s (wall clock)\n' "$RECORDS" "$(echo "$END - $START" | bc)"
