-- Fixed offered load for the benchmark scripts: `dofile(here .. "benchmark-pacing.lua")(rate)`
-- returns a wrk delay() function for RATE requests/s in all.
--
-- delay() is called per wrk thread (it is not told which connection asks), so each thread keeps
-- one schedule for all its connections: slots exactly 1000 * threads / rate ms apart, on a
-- monotonic clock (LuaJIT's ffi; os.clock() is CPU time). A connection whose answer is in takes
-- the next free slot and waits until it comes, so the time its last request took is already
-- accounted for. Slots more than one interval in the past (every connection was busy) are
-- skipped, not made up for with a burst; the achieved rate, printed beside the offered one, then
-- shows the shortfall. wrk waits whole milliseconds: rounding shifts single requests by up to
-- 0.5 ms, never the schedule. OFFER_SIGNER_BENCH_THREADS is wrk's -t (to split the rate).
return function(rate)
    local ffi = require("ffi")
    pcall(ffi.cdef, [[
        typedef struct { long tv_sec; long tv_nsec; } offer_signer_timespec;
        int clock_gettime(int clock, offer_signer_timespec *now);
    ]])
    local CLOCK_MONOTONIC = 1
    local clockValue = ffi.new("offer_signer_timespec")
    local function nowMilliseconds()
        ffi.C.clock_gettime(CLOCK_MONOTONIC, clockValue)
        return tonumber(clockValue.tv_sec) * 1000 + tonumber(clockValue.tv_nsec) / 1000000
    end
    local threads = tonumber(os.getenv("OFFER_SIGNER_BENCH_THREADS") or "1") or 1
    local intervalMilliseconds = 1000 * threads / rate
    local nextSlot = nil
    return function()
        local now = nowMilliseconds()
        if nextSlot == nil then
            -- Threads start at random points of their first interval, not all at once.
            nextSlot = now + math.random() * intervalMilliseconds
        elseif nextSlot < now - intervalMilliseconds then
            -- More than a slot behind: the passed slots are skipped.
            nextSlot = now
        end
        local wait = math.max(0, nextSlot - now)
        nextSlot = nextSlot + intervalMilliseconds
        return math.floor(wait + 0.5)
    end
end
