// Warp specialization: a producer warpgroup that only issues copies and consumer warpgroups that
// only compute, handing K/V buffers back and forth through mbarriers (sm_90a).
// Introduced by stage 11 and shared by the later warp-specialized stages; see mbarrier.cuh for
// the barrier object, its phases and the parity wait.
//
// The ring: each buffer has a "full" barrier (one arrival, the producer's arrive.expect_tx, plus
// the transaction bytes of its copies) and an "empty" barrier (one arrival per consumer warp once
// its wgmmas that read the buffer have retired). The producer waits on empty before refilling,
// the consumers wait on full before reading; each side names the phase it waits for by parity.
//
// Register reallocation: a CTA starts with the per-thread register count ptxas chose for the whole
// kernel (with __launch_bounds__(threads, 1) at most 65536 / threads, rounded down to a multiple of
// 8). setmaxnreg.dec gives a warpgroup's surplus back to the CTA's pool, setmaxnreg.inc takes from
// it (and waits until the pool holds enough). Both are .sync.aligned: every thread of the
// warpgroup executes the same one, so they sit at the top of warpgroup-uniform branches.
#pragma once

#include <cstdint>

// Arrive once on `bar` (no transaction bytes): a consumer warp's "done reading this buffer".
// Release semantics at CTA scope: the warp's earlier reads are ordered before the phase completes.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Lower this warpgroup's per-thread register budget to REGS (24..256, a multiple of 8).
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Raise this warpgroup's per-thread register budget to REGS, once the pool has the registers.
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
