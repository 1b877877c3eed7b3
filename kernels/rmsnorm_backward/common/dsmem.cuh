// Distributed shared memory without a fence: a store into a peer CTA's shared memory that completes
// a transaction on the peer's mbarrier (st.async ... mbarrier::complete_tx), and the mbarrier that
// counts such stores (sm_90). Introduced by the RMSNorm backward's stage 06 (the clusters' dots,
// exchanged a row at a time).
//
// An mbarrier's phase completes when its pending arrivals and its pending transaction bytes both
// reach zero; the waiter names the phase by its parity (0 for the first completion, 1 for the
// second, ...). A receiver arrives once and announces the bytes its peers will deliver
// (arrive.expect_tx); each peer's st.async delivers its bytes and counts them off. The receiver's
// wait then sees the stored values: no barrier.cluster, no membar.
#pragma once

#include <cstdint>

__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The address of the same shared-memory variable in the CTA of rank `rank` of this cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t local, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
    return remote;
}

// One thread initialises the barrier: `arrivals` arrivals per phase.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the cluster's other CTAs (before a cluster barrier).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrive (this phase's one arrival) and announce `bytes` that peers' st.async will deliver.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Spin until the phase of the given parity has completed (try_wait may suspend the thread a while).
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

// Stores `value` at the shared::cluster address `remote` (a peer's, from map_to_rank) and counts its
// 4 bytes off the peer's mbarrier at `remote_bar`.
__device__ __forceinline__ void st_async_f32(uint32_t remote, float value, uint32_t remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote),
                 "r"(__float_as_uint(value)), "r"(remote_bar)
                 : "memory");
}
