#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of Fuzz/ (a package of its own; see Docs/Operations.md,
# "Fuzzing").
#
# Usage:   Scripts/fuzz.sh TARGET SECONDS     one target
#          Scripts/fuzz.sh all SECONDS        every target, one after another
#          Scripts/fuzz.sh list               the targets
# Targets: signature-request  POST /v1/offers/signatures bodies: plain reader, decoder path and
#                             duplicate-member scan, cross-checked
#          pem-key            .p8 and public-key PEM text (PEMDocument, InAppPurchaseKey)
#          apple-signed-data  Apple-signed JWS evidence (AppleSignedDataVerifier)
# Env:     SKIP_BUILD=1 (use the existing Fuzz/.build binaries)
#          FUZZ_ARGS="..." (more libFuzzer flags, e.g. "-jobs=2 -workers=2" or "-seed=1")
#
# For each target: first every input in Fuzz/Regressions/TARGET/ is replayed (each once; a past
# finding must stay fixed), then libFuzzer runs for SECONDS from the committed seeds in
# Fuzz/Corpus/TARGET/ plus a scratch corpus in Fuzz/.build/corpus/TARGET/ (not committed; it
# grows from run to run on the same machine). A crash, a broken cross-check, a leak, an input
# slower than 10 s or over 2 GiB of memory fails the run: the input is copied to
# Fuzz/Regressions/TARGET/ (commit it with the fix) and the command that reproduces it is printed.
# Exit:    0 clean; 1 a finding or a failing regression; 2 bad usage or build failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/opt/swift/usr/bin:$PATH

TARGETS=(signature-request pem-key apple-signed-data)
usage() { echo "usage: Scripts/fuzz.sh TARGET|all SECONDS   (targets: ${TARGETS[*]}; Scripts/fuzz.sh list)" >&2; exit 2; }

[ $# -ge 1 ] || usage
if [ "$1" = list ]; then printf '%s\n' "${TARGETS[@]}"; exit 0; fi
[ $# -eq 2 ] || usage
case "$2" in
    '' | *[!0-9]*) echo "error: SECONDS='$2' is not a whole number of seconds" >&2; exit 2 ;;
esac
SECONDS_PER_TARGET=$2
if [ "$1" = all ]; then
    SELECTED=("${TARGETS[@]}")
else
    SELECTED=()
    for target in "${TARGETS[@]}"; do [ "$target" = "$1" ] && SELECTED=("$1"); done
    [ ${#SELECTED[@]} -eq 1 ] || { echo "error: no fuzz target '$1' (targets: ${TARGETS[*]})" >&2; exit 2; }
fi

# Debug (assertions on, no optimizer hiding bugs), libFuzzer's coverage and AddressSanitizer on
# every Swift module, the main package's and its dependencies' included.
BUILD=(swift build --package-path Fuzz -c debug --sanitize fuzzer --sanitize address)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    echo "==> ${BUILD[*]}"
    started=$(date +%s)
    if [ "$1" = all ]; then
        "${BUILD[@]}" || exit 2
    else
        "${BUILD[@]}" --product "$1" || exit 2
    fi
    echo "==> fuzz build: $(( $(date +%s) - started )) s"
fi
BIN_DIR=$("${BUILD[@]}" --show-bin-path)

# Narrow LeakSanitizer suppressions, each with its reason (Swift keeps some pointers where
# LeakSanitizer cannot see them).
export LSAN_OPTIONS="suppressions=$(pwd)/Fuzz/lsan-suppressions.txt${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

FAILED=0
for target in "${SELECTED[@]}"; do
    BIN="$BIN_DIR/$target"
    [ -x "$BIN" ] || { echo "error: $BIN not found; run ${BUILD[*]}" >&2; exit 2; }
    SEEDS="Fuzz/Corpus/$target"
    REGRESSIONS="Fuzz/Regressions/$target"
    SCRATCH="Fuzz/.build/corpus/$target"
    ARTIFACTS="Fuzz/.build/artifacts/$target"
    mkdir -p "$SCRATCH" "$ARTIFACTS" "$REGRESSIONS"
    rm -f "$ARTIFACTS"/*
    # Timeouts, memory and leaks are findings too.
    FLAGS=(-timeout=10 -rss_limit_mb=2048 -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$ARTIFACTS/")

    # 1. Regressions: every past finding, once each.
    mapfile -t CASES < <(find "$REGRESSIONS" -type f ! -name '.*' ! -name '*.md' | sort)
    if [ ${#CASES[@]} -gt 0 ]; then
        echo "==> $target: replaying ${#CASES[@]} regression inputs from $REGRESSIONS"
        if ! "$BIN" "${FLAGS[@]}" "${CASES[@]}" > "$ARTIFACTS/regressions.log" 2>&1; then
            tail -n 40 "$ARTIFACTS/regressions.log" >&2
            echo "FAIL: $target: a regression input fails again (log: $ARTIFACTS/regressions.log)" >&2
            echo "reproduce: ${BUILD[*]} --product $target && $BIN <input from $REGRESSIONS>" >&2
            FAILED=1
            continue
        fi
    fi

    # 2. Fuzzing from the seeds and the scratch corpus (new inputs go to the scratch one).
    TARGET_FLAGS=()
    if [ "$target" = apple-signed-data ]; then
        # Each input runs the verifier in a Swift Task, whose runtime allocations outlive the
        # input, so libFuzzer would run a full leak check after nearly every input (about 14
        # times slower). Leaks are still checked when the regressions are replayed above.
        TARGET_FLAGS=(-detect_leaks=0)
    fi
    echo "==> $target: fuzzing for ${SECONDS_PER_TARGET}s ($BIN -max_total_time=$SECONDS_PER_TARGET $SCRATCH $SEEDS)"
    status=0
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    "$BIN" "${FLAGS[@]}" ${TARGET_FLAGS[@]+"${TARGET_FLAGS[@]}"} -max_total_time="$SECONDS_PER_TARGET" ${FUZZ_ARGS:-} "$SCRATCH" "$SEEDS" \
        > "$ARTIFACTS/fuzz.log" 2>&1 || status=$?
    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|Done [0-9]+ runs)' "$ARTIFACTS/fuzz.log" || true
    mapfile -t FOUND < <(find "$ARTIFACTS" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \))
    if [ "$status" != 0 ] || [ ${#FOUND[@]} -gt 0 ]; then
        grep -v '^#[0-9]' "$ARTIFACTS/fuzz.log" | tail -n 60 >&2
        echo "FAIL: $target: libFuzzer exited $status (log: $ARTIFACTS/fuzz.log)" >&2
        for input in "${FOUND[@]}"; do
            cp "$input" "$REGRESSIONS/"
            echo "finding kept as $REGRESSIONS/$(basename "$input") (commit it with the fix)" >&2
            echo "reproduce: ${BUILD[*]} --product $target && $BIN $REGRESSIONS/$(basename "$input")" >&2
        done
        FAILED=1
    else
        echo "==> $target: no findings"
    fi
done
exit "$FAILED"
