-- The report both wrk scripts of Scripts/benchmark.sh end with: "BENCH name=value" lines that
-- the script reads. Loaded with dofile() from the scripts beside it.
--
-- wrk counts responses with status >= 400 in summary.errors.status (it prints them as
-- "Non-2xx or 3xx responses"); no response() callback, so wrk need not hand every body to Lua.
done = function(summary, latency, requests)
    local errors = summary.errors
    io.write(string.format("BENCH requests=%d duration_us=%d\n", summary.requests, summary.duration))
    io.write(string.format("BENCH rps=%.1f\n", summary.requests / (summary.duration / 1000000)))
    io.write(string.format("BENCH p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f\n",
        latency:percentile(50) / 1000, latency:percentile(90) / 1000,
        latency:percentile(99) / 1000, latency.max / 1000))
    io.write(string.format("BENCH non2xx=%d socket_errors=%d\n", errors.status,
        errors.connect + errors.read + errors.write + errors.timeout))
end
