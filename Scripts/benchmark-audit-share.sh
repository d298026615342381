#!/usr/bin/env bash
# What the durable audit costs plain signing, measured against the bare Node signer in one run:
# ../shared/bench/compare.sh with this commit's offer-signer (ours) and, as OTHER_BIN, the same
# commit built with one line patched so that the signing route skips its audit commit. The patched
# build exists only for this measurement: it is made in a throw-away worktree and scratch
# directory, named offer-signer-NO-AUDIT, and deleted when the script exits. Never serve it: it
# issues signatures that no audit record or ledger row accounts for.
#
# Usage (from anywhere in the checkout; the committed HEAD is what is measured, never uncommitted
# edits, and the script says so when there are any):
#   Scripts/benchmark-audit-share.sh
#   ROUNDS=3 SECS=10 Scripts/benchmark-audit-share.sh
# Settings: OFFER_SIGNER_BIN (a binary to measure as "ours" instead of HEAD built here: it must be
#           HEAD's, built as the Dockerfile builds, or the comparison is of two commits),
#           COMPARE (default ../shared/bench/compare.sh), SETTLE_SECONDS (30: the wait after the
#           builds, so their writeback does not land on the measured syncs), and compare.sh's own
#           ROUNDS, SECS, RATE. The servers get no OFFER_SIGNER_* setting from the caller's
#           environment (a commit delay or a host there would change what is measured).
# Needs:    what compare.sh needs (wrk, node, curl, python3), git, and about 12 minutes on two
#           cores for the builds (HEAD once, then the patched file again, incrementally).
# Prints:   compare.sh's lines and medians: "ours" is the service as shipped, "other" the same
#           commit without the audit commit, "node" the bare Node signer.
set -euo pipefail
CALLER_DIR=$(pwd)
cd "$(dirname "$0")/.."
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$CALLER_DIR/$1" ;; esac; }
COMPARE=$(absolute "${COMPARE:-$(pwd)/../shared/bench/compare.sh}")
[ -f "$COMPARE" ] || { echo "error: no compare script at $COMPARE (set COMPARE)" >&2; exit 2; }
if [ -n "${OFFER_SIGNER_BIN:-}" ]; then
    OFFER_SIGNER_BIN=$(absolute "$OFFER_SIGNER_BIN")
    [ -x "$OFFER_SIGNER_BIN" ] || { echo "error: OFFER_SIGNER_BIN=$OFFER_SIGNER_BIN is not an executable" >&2; exit 2; }
fi
REV=$(git rev-parse --verify 'HEAD^{commit}')
echo "==> measuring commit $REV"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "note: the checkout has uncommitted changes; they are not measured (the builds are of $REV)" >&2
fi
[ -n "${OFFER_SIGNER_BIN:-}" ] && echo "note: ours is $OFFER_SIGNER_BIN as given; other is $REV patched" >&2

WORK=$(mktemp -d)
cleanup() {
    git worktree remove --force "$WORK/tree" >/dev/null 2>&1 || true
    rm -rf "$WORK"
    git worktree prune >/dev/null 2>&1 || true
}
trap cleanup EXIT
BUILD=(swift build -c release --product offer-signer --static-swift-stdlib --scratch-path "$WORK/build")
git worktree add --detach "$WORK/tree" "$REV" >/dev/null 2>&1
build() {
    if ! (cd "$WORK/tree" && "${BUILD[@]}" >"$WORK/build.log" 2>&1); then
        echo "error: $1 failed; the end of its log:" >&2
        tail -n 30 "$WORK/build.log" >&2
        exit 1
    fi
}

if [ -z "${OFFER_SIGNER_BIN:-}" ]; then
    echo "==> building $REV: swift build -c release --product offer-signer --static-swift-stdlib"
    build "the build of $REV"
    cp "$WORK/build/release/offer-signer" "$WORK/offer-signer"
    OFFER_SIGNER_BIN="$WORK/offer-signer"
fi

echo "==> building $REV without the signing route's audit commit (benchmark only)"
python3 - "$WORK/tree/Sources/OfferSignerServer/Signing/SigningController.swift" <<'PY'
import sys
path = sys.argv[1]
source = open(path).read()
line = "_ = try await committer.commit(appends, within: storeTimeout)"
if source.count(line) != 1:
    sys.exit(f"error: the signing route's audit commit ({line}) is not in {path} exactly once: update this script")
open(path, "w").write(source.replace(line, "_ = appends  // benchmark only: the audit commit skipped"))
PY
build "the patched build"
NO_AUDIT_BIN="$WORK/offer-signer-NO-AUDIT"
mv "$WORK/build/release/offer-signer" "$NO_AUDIT_BIN"
rm -rf "$WORK/build"

# The builds leave gigabytes of writeback behind; the service as shipped syncs every group commit,
# the audit-free build and the Node peer never do, so let the disk settle first.
sync
sleep "${SETTLE_SECONDS:-30}"

OURS_BIN=$OFFER_SIGNER_BIN
echo "==> compare.sh: ours = $OURS_BIN, other = $REV without the audit commit"
for name in $(env | sed -n 's/^\(OFFER_SIGNER_[A-Z0-9_]*\)=.*/\1/p'); do unset "$name"; done
BIN=$OURS_BIN OTHER_BIN=$NO_AUDIT_BIN bash "$COMPARE"
