#!/usr/bin/env bash
# Issue 31's goals in one run: every benchmark its goals name, one after the other on this machine,
# then one table of figures and PASS or MISS, the table Docs/Performance.md keeps ("Issue 31's
# goals"). Each benchmark is its own script; this one only runs them in a fixed order and reads
# their summary lines, so each figure means what that script's section of Performance.md says.
#
# Usage (from anywhere in the checkout):
#   Scripts/benchmark-goals.sh
#   OFFER_SIGNER_BIN=/path/to/offer-signer BASELINE_BIN=/path/to/other/offer-signer Scripts/benchmark-goals.sh
# Settings: OFFER_SIGNER_BIN (the binary to measure; default: build it as the Dockerfile does),
#           BASELINE_BIN (a second build for compare.sh's OTHER_BIN, e.g. the previous release),
#           COMPARE (default ../shared/bench/compare.sh), LOGS (a directory to keep every
#           script's output in; default a new temporary one, kept and named at the end),
#           SKIP (a comma-separated list of runs to leave out: compare, cpu, postgres, stored,
#           lookup), SETTLE_SECONDS (30: the wait after a build, before the first run).
# Needs:    what the scripts need (wrk, node, curl, python3, PostgreSQL's initdb for the
#           PostgreSQL runs) and about 15 minutes on two cores. Nothing else may run meanwhile:
#           every figure is a share of the same two cores.
# Exits:    non-zero when a script fails (a non-2xx answer, a broken audit chain, a missing tool);
#           a MISS is a figure, not a failure.
set -euo pipefail
export PATH=/opt/swift/usr/bin:$PATH
# The runs below are the goals' own: the scripts' settings from the caller's environment would
# change what they measure (a STORE=postgres there would move the SQLite runs).
unset STORE RATE THINK_MS GOALS INSTANCES ROUNDS SECS CONNECTIONS THREADS FORMATS DURATION WARMUP \
    FLOOR_SECONDS CUSTOMERS REPEAT_CUSTOMERS TRANSACTIONS LOOKUP_CPU POSTGRES_URL OTHER_BIN BIN WARM \
    RETENTION_RATE RETENTION_CONNECTIONS PACED_CONNECTIONS DELAY_MS BURST_CONNECTIONS ONCE_SECONDS
CALLER_DIR=$(pwd)
cd "$(dirname "$0")/.."
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$CALLER_DIR/$1" ;; esac; }
COMPARE=$(absolute "${COMPARE:-$(pwd)/../shared/bench/compare.sh}")
SKIP=",${SKIP:-},"
skipped() { [[ "$SKIP" == *",$1,"* ]]; }
skipped compare || [ -f "$COMPARE" ] || { echo "error: no compare script at $COMPARE (set COMPARE, or SKIP=compare)" >&2; exit 2; }

BUILD=(swift build -c release --product offer-signer --static-swift-stdlib)
if [ -n "${OFFER_SIGNER_BIN:-}" ]; then
    BIN=$(absolute "$OFFER_SIGNER_BIN")
else
    echo "==> ${BUILD[*]}"
    "${BUILD[@]}"
    BIN="$(pwd)/.build/release/offer-signer"
    # The build's writeback must not land on the measured syncs (see benchmark-audit-share.sh).
    sync
    echo "==> waiting ${SETTLE_SECONDS:-30} s for the disk to settle after the build"
    sleep "${SETTLE_SECONDS:-30}"
fi
[ -x "$BIN" ] || { echo "error: $BIN is not an executable" >&2; exit 2; }
if [ -n "${BASELINE_BIN:-}" ]; then
    BASELINE_BIN=$(absolute "$BASELINE_BIN")
    [ -x "$BASELINE_BIN" ] || { echo "error: BASELINE_BIN=$BASELINE_BIN is not an executable" >&2; exit 2; }
fi
# A caller's LOGS is read from the caller's directory; mktemp's answer is already a path from here.
if [ -n "${LOGS:-}" ]; then
    LOGS=$(absolute "$LOGS")
else
    LOGS=$(mktemp -d "${TMPDIR:-/tmp}/offer-signer-goals.XXXXXX") || { echo "error: could not make a directory for the logs (set LOGS)" >&2; exit 2; }
fi
{ mkdir -p "$LOGS" && [ -w "$LOGS" ] && [ -x "$LOGS" ]; } || { echo "error: could not make the log directory $LOGS (set LOGS to a directory you can write)" >&2; exit 2; }
export OFFER_SIGNER_BIN=$BIN SKIP_BUILD=1
echo "==> measuring $BIN ($(git rev-parse --short HEAD 2>/dev/null || echo '?') checked out); logs in $LOGS"

RAN=() # the logs this run wrote
run() { # name, then the command: its output goes to $LOGS/name.log and, in short, to the terminal
    local name=$1; shift
    RAN+=("$LOGS/$name.log")
    echo "==> $name: $*"
    local started=$SECONDS
    if ! "$@" > "$LOGS/$name.log" 2>&1; then
        echo "error: $name failed; the end of its log ($LOGS/$name.log):" >&2
        tail -20 "$LOGS/$name.log" >&2
        exit 1
    fi
    echo "    done in $((SECONDS - started)) s"
}
field() { # file, awk program: the first value it prints, or "n/a"
    local value
    value=$(awk "$2" "$1" 2>/dev/null | head -1)
    echo "${value:-n/a}"
}

if ! skipped compare; then
    run compare env ${BASELINE_BIN:+OTHER_BIN="$BASELINE_BIN"} BIN="$BIN" ROUNDS=3 SECS=10 RATE=1000 "$COMPARE"
fi
if ! skipped cpu; then
    run cpu env DURATION=10 Scripts/benchmark.sh
fi
if ! skipped postgres; then
    # Alternated, so both stores see the same state of the machine.
    for round in 1 2; do
        run "plain-sqlite-$round" env STORE=sqlite DURATION=10 FLOOR_SECONDS=0 Scripts/benchmark.sh
        run "plain-postgres-$round" env STORE=postgres DURATION=10 FLOOR_SECONDS=0 Scripts/benchmark.sh
    done
fi
if ! skipped stored; then
    run stored-sqlite env DURATION=10 Scripts/benchmark-stored-history.sh
    run stored-postgres env STORE=postgres DURATION=10 Scripts/benchmark-stored-history.sh
fi
if ! skipped lookup; then
    run lookup env LOOKUP_CPU=1 Scripts/benchmark-apple-history.sh
fi

# --- The table ------------------------------------------------------------------------
number() { [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; }
verdict() { # condition, figures: PASS or MISS by the awk condition; n/a when a figure is not a number
    local condition=$1; shift
    for figure in "$@"; do number "$figure" || { echo "n/a"; return; }; done
    awk "BEGIN { exit !($condition) }" && echo PASS || echo MISS
}
# A run with non-2xx answers or socket errors measured something else: its row says so, and the
# script fails after the table (benchmark.sh and benchmark-apple-history.sh already fail on a
# non-2xx answer on their own, not on socket errors).
broken() { # log: what was wrong with the run, or nothing
    local log=$1 reasons=""
    [ -f "$log" ] || { echo "no log"; return; }
    # compare.sh writes "non2xx=N", the stored-history and Apple scripts "non-2xx N".
    grep -Eq 'non-?2xx[= ][1-9]' "$log" && reasons="non-2xx answers"
    grep -Eq 'socket[ _]errors[:=]? *[1-9]' "$log" && reasons="${reasons:+$reasons, }socket errors"
    grep -Eq '\(must be none\): [1-9]' "$log" && reasons="${reasons:+$reasons, }Apple's API asked"
    echo "$reasons"
}
checked() { # log, verdict: the verdict, or FAIL and why when the run was broken
    local why
    why=$(broken "$1")
    if [ -n "$why" ]; then echo "FAIL ($why: see $1)"; else echo "$2"; fi
}
echo
echo "Issue 31's goals, $(date -u '+%Y-%m-%d %H:%M UTC'), $BIN"
echo
echo "| Goal | Figure | Met? |"
echo "| --- | --- | --- |"
if ! skipped compare; then
    C="$LOGS/compare.log"
    ratio=$(field "$C" '/saturation ratio ours\/node:/ { print $4 }')
    # "median ours   rate=    0:    9058/s  p50   6.73 ms  p99  13.62 ms  (3 runs)"
    ours=$(field "$C" '/^median ours +rate= +0:/ { sub("/s", "", $5); print $5 }')
    node=$(field "$C" '/^median node +rate= +0:/ { sub("/s", "", $5); print $5 }')
    p99=$(field "$C" '/^median ours +rate= +1000:/ { print $10 }')
    # The fixed load achieved: wrk leaves failed and timed-out requests out of its percentiles.
    achieved=$(field "$C" '/^median ours +rate= +1000:/ { sub("/s", "", $5); print $5 }')
    p99node=$(field "$C" '/^median node +rate= +1000:/ { print $10 }')
    echo "| Saturation at least 1.0 × the Node peer (compare.sh) | $ratio ($ours against $node/s) | $(checked "$C" "$(verdict "$ratio >= 1.0" "$ratio")") |"
    echo "| p99 at 1,000/s at most 2 ms, within 1 ms of the Node peer's | $p99 ms (Node peer $p99node ms) | $(checked "$C" "$(verdict "$achieved >= 950 && $p99 <= 2 && $p99 - $p99node <= 1" "$achieved" "$p99" "$p99node")") |"
    if [ -n "${BASELINE_BIN:-}" ]; then
        echo "| (against BASELINE_BIN, not a goal) | $(field "$C" '/saturation ratio ours\/other:/ { print $4 }') | — |"
    fi
fi
if ! skipped cpu; then
    L="$LOGS/cpu.log"
    cpu=$(field "$L" '/^server CPU:/ { print $3 }')
    rps=$(field "$L" '/^requests\/s:/ { print $2 }')
    floor=$(field "$L" '/^floor:/ { print $2 }')
    echo "| Server CPU a signature at most 110 µs (benchmark.sh) | $cpu µs at $rps/s (the /healthz floor $floor/s) | $(checked "$L" "$(verdict "$cpu <= 110" "$cpu")") |"
fi
if ! skipped postgres; then
    ratios=""
    verdicts=""
    overall=PASS
    for round in 1 2; do
        s=$(field "$LOGS/plain-sqlite-$round.log" '/^requests\/s:/ { print $2 }')
        p=$(field "$LOGS/plain-postgres-$round.log" '/^requests\/s:/ { print $2 }')
        r=n/a
        if number "$s" && number "$p"; then r=$(awk -v s="$s" -v p="$p" 'BEGIN { if (s > 0) printf "%.2f", p / s; else print "n/a" }'); fi
        ratios="$ratios${ratios:+, }$r ($p against $s/s)"
        verdicts="$verdicts $(checked "$LOGS/plain-postgres-$round.log" "$(checked "$LOGS/plain-sqlite-$round.log" "$(verdict "$r >= 0.9" "$r")")")"
    done
    # Any FAIL makes the row a FAIL; else any n/a n/a; else any MISS a MISS.
    case "$verdicts" in *FAIL*) overall="FAIL (see the plain-*.log files)" ;; *n/a*) overall=n/a ;; *MISS*) overall=MISS ;; esac
    echo "| PostgreSQL plain signing at least 0.9 × SQLite (alternated, two pairs) | $ratios | $overall |"
fi
if ! skipped stored; then
    s=$(field "$LOGS/stored-sqlite.log" '/^sign / { print $2 }')
    p=$(field "$LOGS/stored-postgres.log" '/^sign / { print $2 }')
    # "retention  499.6 requests/s, p50 1.722 ms, p99 2.884 ms, ..."
    rs=$(field "$LOGS/stored-sqlite.log" '/^retention / { print $8 }')
    rp=$(field "$LOGS/stored-postgres.log" '/^retention / { print $8 }')
    echo "| Signing under rules on stored history, SQLite, at least 5,000/s | $s/s (Retention Messaging p99 $rs ms at 500/s) | $(checked "$LOGS/stored-sqlite.log" "$(verdict "$s >= 5000" "$s")") |"
    echo "| The same on PostgreSQL, at least 3,000/s | $p/s (Retention Messaging p99 $rp ms at 500/s) | $(checked "$LOGS/stored-postgres.log" "$(verdict "$p >= 3000" "$p")") |"
fi
if ! skipped lookup; then
    L="$LOGS/lookup.log"
    pairs=$(field "$L" '/each pair:/ { sub(/.*each pair: /, ""); sub(/ us; median.*/, ""); print }')
    median=$(field "$L" '/each pair:/ { sub(/.*median /, ""); sub(/ us.*/, ""); print }')
    echo "| A 20-transaction Apple history asked again, at most 1 ms of server CPU | $median µs (pairs $pairs µs) | $(checked "$L" "$(verdict "$median <= 1000" "$median")") |"
fi
echo
echo "logs: $LOGS"
for log in ${RAN[@]+"${RAN[@]}"}; do
    [ -z "$(broken "$log")" ] || { echo "FAIL: a run had non-2xx answers or socket errors, or asked Apple (the table says which)" >&2; exit 1; }
done
