// Host-only: prints the wgmma descriptors stage 08 builds (from common/wgmma.cuh itself), field by
// field, for a shared-memory base of 0x400 (where ptxas places dynamic shared memory on sm_90).
//   nvcc -std=c++17 -I../../kernels/attention/common desc_bits.cu -o /tmp/desc_bits && /tmp/desc_bits
#include <cstdio>
#include "wgmma.cuh"

static void show(const char* what, uint64_t d) {
    printf("%-22s 0x%016llx  start 0x%05llx  LBO %5llu  SBO %5llu  base %llu  layout %llu\n", what,
           (unsigned long long)d, (unsigned long long)((d & 0x3fff) << 4),
           (unsigned long long)(((d >> 16) & 0x3fff) << 4), (unsigned long long)(((d >> 32) & 0x3fff) << 4),
           (unsigned long long)((d >> 49) & 7), (unsigned long long)(d >> 62));
}

int main() {
    const uint32_t base = 0x400, q = base, k = q + 16384, v = k + 2 * 16384, p = v + 2 * 16384;
    char name[64];
    for (int kk = 0; kk < 8; ++kk) {
        snprintf(name, sizeof name, "Q  step %d", kk);
        show(name, make_smem_desc_sw128(q + (kk * 16 / 64) * 8192 + (kk * 16 % 64) * 2, 16, 1024));
    }
    for (int kk = 0; kk < 8; ++kk) {
        snprintf(name, sizeof name, "K0 step %d", kk);
        show(name, make_smem_desc_sw128(k + (kk * 16 / 64) * 8192 + (kk * 16 % 64) * 2, 16, 1024));
    }
    for (int j = 0; j < 4; ++j) {
        snprintf(name, sizeof name, "P  step %d", j);
        show(name, make_smem_desc_sw128(p + j * 32, 16, 1024));
    }
    for (int j = 0; j < 4; ++j) {
        snprintf(name, sizeof name, "V0 step %d (tnspB)", j);
        show(name, make_smem_desc_sw128(v + j * 2048, 8192, 1024));
    }
    return 0;
}
