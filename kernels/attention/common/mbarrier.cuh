// mbarrier: a 64-bit barrier object in shared memory that the TMA engine can complete (sm_90).
// Introduced by stage 07 and shared by every later stage that loads with TMA.
//
// A barrier counts two things in its current phase: pending arrivals (set at init) and pending
// transaction bytes. A phase completes when both reach zero; the barrier then flips its phase bit
// and re-arms itself with the initial arrival count. Waiters name the phase they wait for by its
// parity (0 for the first completion, 1 for the second, 0 again for the third, ...).
#pragma once

#include <cstdint>

// One thread initialises the barrier; `arrivals` arrivals per phase (1 here: the issuing thread).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the async proxy (the TMA engine) that will complete
// them; the barrier after it makes them visible to the other threads.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Arrive (counts as this phase's one arrival) and announce `bytes` more transaction bytes that the
// copies issued next will deliver; the phase cannot complete before they have landed.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Spin until the phase with the given parity has completed. try_wait may suspend the thread for a
// while in hardware before it reports "not yet", so the loop does not hammer shared memory.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
