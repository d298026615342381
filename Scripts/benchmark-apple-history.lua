-- wrk script for Scripts/benchmark-apple-history.sh: POST /v1/offers/signatures for an offer
-- decided on Apple's history, each request naming a new customer (transactionID), so every
-- request misses the service's cache and asks the fake App Store Server API.
--
-- Environment: OFFER_SIGNER_BENCH_SECRET (the API key; unset: GET requests with a dummy ES256
--              bearer token, for measuring the fake API itself).

local secret = os.getenv("OFFER_SIGNER_BENCH_SECRET")
local threadCount = 0
setup = function(thread)
    threadCount = threadCount + 1
    thread:set("thread_id", threadCount)
end

local counter = 0
request = function()
    counter = counter + 1
    -- Distinct per thread and request: 7xxxxxxxxx.
    local id = string.format("7%02d%07d", thread_id or 0, counter)
    if secret == nil or secret == "" then
        return wrk.format("GET", "/production/inApps/v2/history/" .. id,
            { ["Authorization"] = "Bearer eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.e30.c2ln" })
    end
    local body = '{"productID":"com.example.bench.monthly","offerID":"BENCH_APPLE","transactionID":"' .. id .. '"}'
    return wrk.format("POST", nil, { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. secret }, body)
end

local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
dofile(here .. "benchmark-report.lua")
