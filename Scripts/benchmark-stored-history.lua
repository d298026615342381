-- wrk script for Scripts/benchmark-stored-history.sh.
--
-- OFFER_SIGNER_BENCH_MODE=sign: POST /v1/offers/signatures for an offer decided on Apple's history
--   (historySource apple), customers taken in turn (transactionID and appAccountToken of customer
--   i as Scripts/stored-history-fixtures.py makes them; OFFER_SIGNER_BENCH_CUSTOMERS of them);
--   needs OFFER_SIGNER_BENCH_SECRET; the offer is OFFER_SIGNER_BENCH_OFFER (default STORED_RULES).
-- OFFER_SIGNER_BENCH_MODE=retention: POST /v1/apple/retention with the bodies of
--   OFFER_SIGNER_BENCH_BODIES (one per line), each sent once (thread t takes lines t, t + T, …).
-- OFFER_SIGNER_BENCH_RATE (N > 0): a fixed offered load (Scripts/benchmark-pacing.lua).

local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
local mode = os.getenv("OFFER_SIGNER_BENCH_MODE") or "sign"
local secret = os.getenv("OFFER_SIGNER_BENCH_SECRET") or ""
local customers = tonumber(os.getenv("OFFER_SIGNER_BENCH_CUSTOMERS") or "1000") or 1000
local threads = tonumber(os.getenv("OFFER_SIGNER_BENCH_THREADS") or "1") or 1
local offer = os.getenv("OFFER_SIGNER_BENCH_OFFER") or "STORED_RULES"

local threadCount = 0
setup = function(thread)
    threadCount = threadCount + 1
    thread:set("thread_id", threadCount)
end

local bodies = nil
local counter = 0

local function loadBodies()
    bodies = {}
    local number = 0
    for line in io.lines(os.getenv("OFFER_SIGNER_BENCH_BODIES")) do
        if number % threads == (thread_id or 1) - 1 then bodies[#bodies + 1] = line end
        number = number + 1
    end
end

request = function()
    counter = counter + 1
    if mode == "retention" then
        if bodies == nil then loadBodies() end
        -- Past the last body, the first ones again: the service refuses those as replays (409).
        local body = bodies[(counter - 1) % #bodies + 1]
        return wrk.format("POST", "/v1/apple/retention", { ["Content-Type"] = "application/json" }, body)
    end
    local index = ((thread_id or 1) * 7919 + counter) % customers
    local body = string.format(
        '{"productID":"com.example.bench.monthly","offerID":"%s","transactionID":"%d","appAccountToken":"00000000-0000-4000-8000-%012d"}',
        offer, 600000000 + index, index)
    return wrk.format("POST", "/v1/offers/signatures", { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. secret }, body)
end

local rate = tonumber(os.getenv("OFFER_SIGNER_BENCH_RATE") or "0") or 0
if rate > 0 then delay = dofile(here .. "benchmark-pacing.lua")(rate) end

dofile(here .. "benchmark-report.lua")
