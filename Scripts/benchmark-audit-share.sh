#!/usr/bin/env bash
# What the durable audit costs plain signing, measured against the bare Node signer in one run:
# ../shared/bench/compare.sh with this checkout's offer-signer (BIN) and, as OTHER_BIN, the same
# commit built with one line patched so that the signing route skips its audit commit. The patched
# build exists only for this measurement: it is made in a throw-away worktree and scratch
# directory, and deleted when the script exits. Never serve it: it issues signatures that no
# audit record or ledger row accounts for.
#
# Usage (from the project root; the committed HEAD is what is measured, not uncommitted edits):
#   Scripts/benchmark-audit-share.sh
#   OFFER_SIGNER_BIN=.build/release/offer-signer ROUNDS=3 SECS=10 Scripts/benchmark-audit-share.sh
# Settings: OFFER_SIGNER_BIN (the unpatched binary; built from HEAD as the Dockerfile does when
#           unset), COMPARE (default ../shared/bench/compare.sh), SETTLE_SECONDS (30: the wait after
#           the builds, for their writes to reach the disk), and compare.sh's own ROUNDS, SECS, RATE.
# Needs:    what compare.sh needs (wrk, node, curl, python3), git, and about 12 minutes on two
#           cores for the patched build.
# Prints:   compare.sh's lines and medians: "ours" is the service as shipped, "other" the same
#           commit without the audit commit, "node" the bare Node signer.
set -euo pipefail
cd "$(dirname "$0")/.."
COMPARE=${COMPARE:-../shared/bench/compare.sh}
[ -f "$COMPARE" ] || { echo "error: no compare script at $COMPARE (set COMPARE)" >&2; exit 2; }
WORK=$(mktemp -d)
cleanup() {
    git worktree remove --force "$WORK/tree" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
BUILD=(swift build -c release --product offer-signer --static-swift-stdlib)

if [ -z "${OFFER_SIGNER_BIN:-}" ]; then
    echo "==> building HEAD: ${BUILD[*]}"
    git worktree add --detach "$WORK/head" HEAD >/dev/null
    (cd "$WORK/head" && "${BUILD[@]}" --scratch-path "$WORK/head-build" >/dev/null)
    cp "$WORK/head-build/release/offer-signer" "$WORK/offer-signer"
    git worktree remove --force "$WORK/head" >/dev/null
    OFFER_SIGNER_BIN="$WORK/offer-signer"
fi

echo "==> building HEAD without the signing route's audit commit (benchmark only)"
git worktree add --detach "$WORK/tree" HEAD >/dev/null
python3 - "$WORK/tree/Sources/OfferSignerServer/Signing/SigningController.swift" <<'PY'
import sys
path = sys.argv[1]
source = open(path).read()
line = "_ = try await committer.commit(appends, within: storeTimeout)"
if source.count(line) != 1:
    sys.exit(f"error: the signing route's audit commit ({line}) is not in {path} exactly once: update this script")
open(path, "w").write(source.replace(line, "_ = appends  // benchmark only: the audit commit skipped"))
PY
(cd "$WORK/tree" && "${BUILD[@]}" --scratch-path "$WORK/build" >/dev/null 2>&1) || { echo "error: the patched build failed" >&2; exit 1; }

# The builds leave gigabytes of writeback behind; the service as shipped syncs every group commit,
# the audit-free build and the Node peer never do, so let the disk settle first.
sync
sleep "${SETTLE_SECONDS:-30}"

echo "==> compare.sh: ours = $OFFER_SIGNER_BIN, other = the same commit without the audit commit"
BIN=$OFFER_SIGNER_BIN OTHER_BIN="$WORK/build/release/offer-signer" bash "$COMPARE"
