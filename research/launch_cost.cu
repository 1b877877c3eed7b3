// What one forward launch costs on the host, piece by piece (issue #29: the host cost of a call,
// research/host_cost.md). Loads a stage's library as the binding does and calls hopattn_launch in a
// loop; then times, alone, each CUDA call that launch makes. CPU microseconds per call, medians of
// batches (the GPU is synchronised between batches, so the launch queue never fills).
//
//   nvcc -O2 -std=c++17 -arch=sm_90a -I kernels/attention/common research/launch_cost.cu -o build/launch_cost -ldl
//   build/launch_cost build/kernels/stage24-head-dims-<key>.so
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "abi.h"
#include "tma_4d.cuh"

using LaunchFn = int (*)(const AttnParams*, cudaStream_t, char*, int);

__global__ void empty_kernel(const __grid_constant__ CUtensorMap a, const __grid_constant__ CUtensorMap b,
                             const __grid_constant__ CUtensorMap c, const __grid_constant__ CUtensorMap d,
                             const AttnParams p) {}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over `batches` of the mean µs per call in a batch of `calls`; the GPU drained between batches.
template <typename F>
static double time_calls(F&& f, int batches = 15, int calls = 200) {
    std::vector<double> per_call;
    for (int b = 0; b < batches; ++b) {
        cudaDeviceSynchronize();
        const double t0 = now_us();
        for (int i = 0; i < calls; ++i) f();
        per_call.push_back((now_us() - t0) / calls);
    }
    std::sort(per_call.begin(), per_call.end());
    return per_call[per_call.size() / 2];
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s STAGE_LIBRARY.so\n", argv[0]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
        return 1;
    }
    auto launch = reinterpret_cast<LaunchFn>(dlsym(lib, "hopattn_launch"));
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    char err[512] = {0};

    // LTX-2's audio self-attention (host_cost.py's "ltx2-audio"): batch 1, 32 heads, 256 x 256, d 64,
    // BSHD; and the same at d 128. The kernel is a few µs, so the host decides.
    for (int dim : {64, 128}) {
        for (int causal : {0, 1}) {
            const int B = 1, H = 32, L = 256;
            void* buf[4];
            for (auto& b : buf) cudaMalloc(&b, size_t(B) * H * L * dim * 2);
            cudaMemset(buf[0], 0, size_t(B) * H * L * dim * 2);  // q, k, v: zeros (only the host is timed)
            cudaMemset(buf[1], 0, size_t(B) * H * L * dim * 2);
            cudaMemset(buf[2], 0, size_t(B) * H * L * dim * 2);
            AttnParams p{};
            p.q = buf[0], p.k = buf[1], p.v = buf[2], p.o = buf[3];
            const int64_t bshd[3] = {int64_t(L) * H * dim, dim, int64_t(H) * dim};  // batch, head, row
            for (int i = 0; i < 3; ++i) p.q_stride[i] = p.k_stride[i] = p.v_stride[i] = p.o_stride[i] = bshd[i];
            p.batch = B, p.heads = H, p.kv_heads = H, p.len_q = L, p.len_k = L, p.head_dim = dim;
            p.scale = 0.125f, p.causal = causal, p.num_sms = sms, p.lse = nullptr;
            if (launch(&p, stream, err, sizeof(err))) {
                fprintf(stderr, "launch failed: %s\n", err);
                return 1;
            }
            const double full = time_calls([&] { launch(&p, stream, err, sizeof(err)); });
            // torch's current stream is the legacy default stream unless the caller set another
            const double legacy = time_calls([&] { launch(&p, nullptr, err, sizeof(err)); });
            printf("hopattn_launch  d %3d %-10s %6.2f us a call (created stream), %6.2f (legacy default stream)\n",
                   dim, causal ? "causal" : "non-causal", full, legacy);
            for (auto& b : buf) cudaFree(b);
        }
    }

    // The pieces, alone.
    void* base;
    cudaMalloc(&base, 1 << 24);
    const int64_t strides[3] = {256 * 32 * 64, 64, 32 * 64};
    CUtensorMap maps[4];
    const double encode = time_calls([&] {
        make_tma_4d_bf16(&maps[0], base, 1, 32, 256, 64, strides, 128, 64, "q", err, sizeof(err));
    });
    printf("one cuTensorMapEncodeTiled (make_tma_4d_bf16)   %6.2f us\n", encode);
    const double attribute = time_calls(
        [&] { cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024); });
    printf("cudaFuncSetAttribute (max dynamic smem)         %6.2f us\n", attribute);
    AttnParams p{};
    const double kernel_launch = time_calls([&] {
        empty_kernel<<<132, 384, 200 * 1024, stream>>>(maps[0], maps[0], maps[0], maps[0], p);
    });
    printf("<<<>>> launch, 4 tensor maps + params (%zu B)   %6.2f us\n", 4 * sizeof(CUtensorMap) + sizeof(p),
           kernel_launch);
    const double last_error = time_calls([&] { cudaGetLastError(); });
    printf("cudaGetLastError                                %6.2f us\n", last_error);
    const double counter = time_calls([&] {
        int* c;
        cudaMallocAsync(reinterpret_cast<void**>(&c), sizeof(int), stream);
        cudaMemsetAsync(c, 0, sizeof(int), stream);
        cudaFreeAsync(c, stream);
    });
    printf("cudaMallocAsync + cudaMemsetAsync + cudaFreeAsync %6.2f us\n", counter);
    const double memset_only = time_calls([&] { cudaMemsetAsync(base, 0, sizeof(int), stream); });
    printf("cudaMemsetAsync alone                           %6.2f us\n", memset_only);
    int device;
    const double get_device = time_calls([&] { cudaGetDevice(&device); });
    printf("cudaGetDevice                                   %6.2f us\n", get_device);
    cudaDeviceSynchronize();
    printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}
