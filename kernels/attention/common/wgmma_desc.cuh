// wgmma descriptors built from constant offsets (stages 19-22 each carried a copy of these in
// their kernel.cu; stage 23 is the first to include them from here).
//
// Every operand of those kernels sits in a tile stored with the 128-byte swizzle, whose
// descriptors share one high word (stride byte offset 1024, the swizzle mode); within a tile only
// the start address moves. A tile's descriptor is then its low word, computed once, and each
// operand's is that word plus a compile-time offset: one add, no shifts and masks per k-step.
#pragma once

#include <cstdint>

#include "wgmma.cuh"

constexpr uint32_t SW128_ATOM_BYTES = 1024;  // 8 rows x 128 bytes: the SBO of every descriptor

// The low word of a tile's descriptor: start address and leading byte offset.
__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_addr, uint32_t lbo_bytes) {
    return uint32_t(make_smem_desc_sw128(smem_addr, lbo_bytes, SW128_ATOM_BYTES));
}

// The descriptor of an operand at `byte_offset` from the start of its tile, given the low word of
// the tile's own descriptor. byte_offset is a compile-time constant at every call of the stages
// that use it, so this is one add.
__device__ __forceinline__ uint64_t desc_at(uint32_t tile_desc_lo, uint32_t byte_offset) {
    constexpr uint64_t high = make_smem_desc_sw128(0, 0, SW128_ATOM_BYTES) & 0xffffffff00000000ull;
    return high | (tile_desc_lo + (byte_offset >> 4));
}
