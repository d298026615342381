-- wrk script for Scripts/benchmark.sh's floor run: plain GET /healthz (wrk's static request, no
-- Lua per request), reporting in the same "BENCH name=value" lines as benchmark-signatures.lua.
-- The floor is what the HTTP stack and wrk, sharing the same cores, cost for a request that does
-- no work: no request to /v1/offers/signatures can be answered faster or with a tighter tail.
-- The shared report (done()), from the directory this script is in.
local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
dofile(here .. "benchmark-report.lua")
