// Division by a number that the compiler does not know but that is the same for a whole launch
// (the heads, the q-blocks of a head, the heads of a group). Introduced by stage 22 and shared by
// the stages after it.
//
// An integer division the compiler cannot see the divisor of is about 25 dependent instructions
// (I2F, MUFU.RCP, F2I, a multiply and two corrections); finding an output tile's coordinates takes
// four or five of them, one after the other, at every tile boundary. The host instead finds a
// multiplier once per launch, and the device divides with one wide multiply and a shift.
//
// Why it is exact. For a divisor d (1 <= d < 2^31) let l = ceil(log2 d) and m = ceil(2^(31+l) / d);
// m fits in 32 bits (m < 2^(31+l) / 2^(l-1) + 1 = 2^32 + 1, and m = 2^32 would need d = 2^(l-1)).
// Write m d = 2^(31+l) + e with 0 <= e < d. For 0 <= n < 2^31,
//     n m / 2^(31+l) = n / d + n e / (d 2^(31+l)),
// and n e < 2^31 2^l, so the second term is below 1 / d: it cannot carry n / d = q + r / d
// (r <= d - 1) past q + 1, and the floor is q.
#pragma once

#include <cstdint>

struct FastDivmod {
    uint32_t divisor;     // d
    uint32_t multiplier;  // m = ceil(2^(31+l) / d)
    uint32_t shift;       // 31 + l
};

// The host's half: d must be in [1, 2^31).
inline FastDivmod make_fast_divmod(int d) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < uint64_t(d)) ++l;
    const uint64_t two_to_shift = uint64_t(1) << (31 + l);
    return FastDivmod{uint32_t(d), uint32_t((two_to_shift + uint64_t(d) - 1) / uint64_t(d)), 31 + l};
}

// n / d for 0 <= n < 2^31: IMAD.WIDE.U32 and a 64-bit shift.
__host__ __device__ __forceinline__ int fast_div(int n, const FastDivmod& f) {
    return int((uint64_t(uint32_t(n)) * f.multiplier) >> f.shift);
}

// n / d and n % d.
__host__ __device__ __forceinline__ void fast_divmod(int n, const FastDivmod& f, int& quotient, int& remainder) {
    quotient = fast_div(n, f);
    remainder = n - quotient * int(f.divisor);
}
