-- wrk script for Scripts/benchmark.sh: POST /v1/offers/signatures with an API key and random
-- appAccountTokens (4,096 per wrk thread, cycled; the benchmark turns the per-token limit off).
--
-- Environment: OFFER_SIGNER_BENCH_SECRET (the API key, required),
--              OFFER_SIGNER_BENCH_FORMATS ("legacy" (default), "jws" or "legacy,jws"),
--              OFFER_SIGNER_BENCH_THINK_MS (default 0: each connection sends its next request as
--              soon as the answer is in, i.e. saturation; N > 0: it waits N ms first, like a
--              client with think time, so latency is measured below saturation),
--              OFFER_SIGNER_BENCH_RATE (default 0; N > 0: a fixed offered load of N requests/s in
--              all, paced as described at delay() below; excludes THINK_MS),
--              OFFER_SIGNER_BENCH_THREADS (wrk's -t, to split RATE between the threads).

local secret = os.getenv("OFFER_SIGNER_BENCH_SECRET")
if secret == nil or secret == "" then
    error("set OFFER_SIGNER_BENCH_SECRET to the API key")
end

-- The directory this script is in (for the shared pacing and report).
local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")

local formats = os.getenv("OFFER_SIGNER_BENCH_FORMATS") or "legacy"
local formatsJSON = {}
for name in string.gmatch(formats, "[^,%s]+") do
    formatsJSON[#formatsJSON + 1] = '"' .. name .. '"'
end
formatsJSON = "[" .. table.concat(formatsJSON, ",") .. "]"

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. secret

-- Each wrk thread has its own Lua state: number the threads in setup() (main state) and
-- seed each thread's generator differently in init() (thread state).
local threadCount = 0
setup = function(thread)
    threadCount = threadCount + 1
    thread:set("thread_id", threadCount)
end

init = function(args)
    math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919 + math.floor(os.clock() * 1000000))
end

-- A random version-4 UUID (8-4-4-4-12 lowercase hex).
local function uuid4()
    local template = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx"
    return (string.gsub(template, "[xy]", function(c)
        local v = (c == "x") and math.random(0, 15) or math.random(8, 11)
        return string.format("%x", v)
    end))
end

-- Requests are built once per thread (a pool of distinct appAccountTokens, cycled), so wrk
-- spends its share of the shared CPU on sending, not on string formatting.
local pool = {}
local poolSize = 4096
local nextIndex = 0

local function build()
    for i = 1, poolSize do
        local body = '{"productID":"com.example.bench.monthly","offerID":"BENCH_OFFER",'
            .. '"appAccountToken":"' .. uuid4() .. '","formats":' .. formatsJSON .. '}'
        pool[i] = wrk.format(nil, nil, nil, body)
    end
end

-- wrk calls delay() before each request when the script defines it; saturation runs leave it
-- undefined so wrk does not pay for a Lua call per request.
local thinkMilliseconds = tonumber(os.getenv("OFFER_SIGNER_BENCH_THINK_MS") or "0") or 0
local rate = tonumber(os.getenv("OFFER_SIGNER_BENCH_RATE") or "0") or 0
if thinkMilliseconds > 0 and rate > 0 then
    error("OFFER_SIGNER_BENCH_THINK_MS and OFFER_SIGNER_BENCH_RATE exclude each other")
end
if thinkMilliseconds > 0 then
    delay = function() return thinkMilliseconds end
elseif rate > 0 then
    delay = dofile(here .. "benchmark-pacing.lua")(rate)
end

request = function()
    if nextIndex == 0 then build() end
    nextIndex = nextIndex % poolSize + 1
    return pool[nextIndex]
end

-- The shared report (done()).
dofile(here .. "benchmark-report.lua")
