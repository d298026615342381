-- wrk script for Scripts/benchmark.sh's floor run: plain GET /healthz (wrk's static request, no
-- Lua per request), reporting in the same "BENCH name=value" lines as benchmark-signatures.lua.
-- The floor is what the HTTP stack and wrk, sharing the same cores, cost for a request that does
-- no work: no request to /v1/offers/signatures can be answered faster or with a tighter tail.
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
