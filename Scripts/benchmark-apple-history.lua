-- wrk script for Scripts/benchmark-apple-history.sh: POST /v1/offers/signatures for an offer
-- decided on Apple's history, each request naming a new customer (transactionID), so every
-- request misses the service's cache and asks the fake App Store Server API.
--
-- Environment: OFFER_SIGNER_BENCH_SECRET (the API key; unset: GET requests with a dummy ES256
--              bearer token, for measuring the fake API itself).
--              OFFER_SIGNER_BENCH_RUN (a digit in every transaction ID, so that no run asks for
--              an ID an earlier run asked for, which the service's cache would answer).
--              OFFER_SIGNER_BENCH_ONCE=N (each of the thread's N connections sends one request and
--              no other: with -c1000 -t2 and N=500, a burst of exactly 1,000 requests at once).
--              OFFER_SIGNER_BENCH_RATE=N (N > 0, without ONCE): a fixed offered load of N
--              requests/s in all (Scripts/benchmark-pacing.lua; OFFER_SIGNER_BENCH_THREADS is -t).
--              OFFER_SIGNER_BENCH_REPEAT=K (K > 0): the transaction IDs of K customers, asked over
--              and over (500000000 + i, i < K), instead of a new one every request.
--              OFFER_SIGNER_BENCH_OFFER (default BENCH_APPLE): the offer asked for.

local secret = os.getenv("OFFER_SIGNER_BENCH_SECRET")
local run = tonumber(os.getenv("OFFER_SIGNER_BENCH_RUN") or "0") or 0
local once = tonumber(os.getenv("OFFER_SIGNER_BENCH_ONCE") or "0") or 0
if once > 0 then
    -- wrk asks delay() before every request of a connection, the first included; the thread's
    -- first `once` calls come as its connections open, before any answer (50 ms away at least).
    local asked = 0
    delay = function()
        asked = asked + 1
        if asked <= once then return 0 end
        return 3600000
    end
end
local threadCount = 0
setup = function(thread)
    threadCount = threadCount + 1
    thread:set("thread_id", threadCount)
end

local repeat_customers = tonumber(os.getenv("OFFER_SIGNER_BENCH_REPEAT") or "0") or 0
local offer = os.getenv("OFFER_SIGNER_BENCH_OFFER") or "BENCH_APPLE"
local counter = 0
request = function()
    counter = counter + 1
    -- Distinct per run, thread and request: 7RTTNNNNNNN; or one of the first K customers.
    local id = string.format("7%d%02d%07d", run % 10, thread_id or 0, counter)
    if repeat_customers > 0 then id = tostring(500000000 + (counter * 7 + (thread_id or 0)) % repeat_customers) end
    if secret == nil or secret == "" then
        return wrk.format("GET", "/production/inApps/v2/history/" .. id,
            { ["Authorization"] = "Bearer eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.e30.c2ln" })
    end
    local body = '{"productID":"com.example.bench.monthly","offerID":"' .. offer .. '","transactionID":"' .. id .. '"}'
    return wrk.format("POST", nil, { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. secret }, body)
end

local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
local rate = tonumber(os.getenv("OFFER_SIGNER_BENCH_RATE") or "0") or 0
if rate > 0 and once == 0 then delay = dofile(here .. "benchmark-pacing.lua")(rate) end
dofile(here .. "benchmark-report.lua")
