// The occupancy the softmax forward's stage 05 notes argue from, as the GPU reports it: for each
// long-row configuration of stages 04 and 05 (bf16), the registers a thread, the CTAs an SM holds
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor), the bytes an SM has in flight while all its CTAs
// load (CTAs × threads × 8 vectors × 16 bytes), and the clusters the GPU holds at once
// (cudaOccupancyMaxActiveClusters), with the SMs' worth of CTA slots those clusters fill. Stage 05's
// kernel is stage 04's, so its templates stand for both stages' configurations.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o build/softmax-occupancy \
//        research/softmax/occupancy.cu && build/softmax-occupancy       # bash research/softmax/gpu_run.sh runs it
#include "../../kernels/softmax/05_small-ctas-for-long-rows/kernel.cu"

#include <cstdio>

namespace {

// One configuration's line; 0 on success.
template <int kThreadsPerRow, int kCluster>
int report(const char* who, int sms) {
    using C = Config<kThreadsPerRow, kVectorsPerThread, kCluster>;
    auto kernel = rows_kernel<__nv_bfloat16, C>;
    cudaFuncAttributes attr;
    int per_sm = 0, clusters = 0;
    if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreadsPerRow, 0) != cudaSuccess)
        return 1;
    if constexpr (kCluster > 1) {
        if (kCluster > kWideCluster) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        ClusterLaunch<C> launch(1, nullptr);
        if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) != cudaSuccess) {
            std::printf("%-34s cudaOccupancyMaxActiveClusters: %s\n", who, cudaGetErrorString(cudaGetLastError()));
            clusters = 0;
        }
    }
    const int in_flight_kb = per_sm * kThreadsPerRow * kVectorsPerThread * 16 / 1024;
    std::printf("%-34s %4d threads  %3d registers  %d CTAs/SM  %4d KB in flight/SM", who, kThreadsPerRow,
                attr.numRegs, per_sm, in_flight_kb);
    if (kCluster > 1)
        std::printf("  cluster %2d: %3d resident, %5.1f of %d SMs' CTA slots", kCluster, clusters,
                    per_sm ? (double)clusters * kCluster / per_sm : 0.0, sms);
    std::printf("\n");
    return 0;
}

}  // namespace

int main() {
    int device = 0, sms = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        std::printf("no CUDA device\n");
        return 1;
    }
    sms = prop.multiProcessorCount;
    std::printf("%s: %d SMs, %d registers an SM, %zu KB shared memory an SM\n", prop.name, sms,
                prop.regsPerMultiprocessor, prop.sharedMemPerMultiprocessor / 1024);
    int failed = 0;
    failed += report<256, 1>("16k (stages 03-05)", sms);
    failed += report<1024, 1>("64k, stage 04: one CTA", sms);
    failed += report<256, 4>("64k, stage 05: 4 slices", sms);
    failed += report<256, 8>("128k, stage 05: 8 slices", sms);
    failed += report<1024, 4>("256k, stage 04: cluster of 4", sms);
    failed += report<256, 16>("256k, stage 05: 16 slices", sms);
    failed += report<1024, 8>("512k, stages 04-05: cluster of 8", sms);
    return failed ? 1 : 0;
}
