// Element types of the RMSNorm lineage (bf16, fp16, fp32): conversion to and from fp32, and
// moving N consecutive elements as one access (16 bytes: LDG.E.128 / STG.E.128) or one by one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "abi_rmsnorm.h"

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }

// Elements of T in one 16-byte access.
template <typename T> constexpr int kVec16 = 16 / sizeof(T);

// N elements at p (aligned to N·sizeof(T) when that is 16 bytes) into fp32.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float (&f)[N]) {
    if constexpr (sizeof(T) * N == 16) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        T t[N];
        memcpy(t, &raw, 16);
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] = to_float(t[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] = to_float(p[i]);
    }
}

// N fp32 values rounded to T and stored at p (aligned as for load_floats).
template <typename T, int N>
__device__ __forceinline__ void store_floats(T* p, const float (&f)[N]) {
    if constexpr (sizeof(T) * N == 16) {
        T t[N];
#pragma unroll
        for (int i = 0; i < N; ++i) t[i] = from_float<T>(f[i]);
        uint4 raw;
        memcpy(&raw, t, 16);
        *reinterpret_cast<uint4*>(p) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) p[i] = from_float<T>(f[i]);
    }
}

// 16 bytes of T held packed in four 32-bit registers (a row kept on chip costs 4 registers per
// vector whatever T is), unpacked to fp32 where they are used.
template <typename T>
__device__ __forceinline__ void unpack(const uint4& raw, float (&f)[kVec16<T>]) {
    T t[kVec16<T>];
    memcpy(t, &raw, 16);
#pragma unroll
    for (int i = 0; i < kVec16<T>; ++i) f[i] = to_float(t[i]);
}

template <typename T>
__device__ __forceinline__ uint4 pack(const float (&f)[kVec16<T>]) {
    T t[kVec16<T>];
#pragma unroll
    for (int i = 0; i < kVec16<T>; ++i) t[i] = from_float<T>(f[i]);
    uint4 raw;
    memcpy(&raw, t, 16);
    return raw;
}

// The element type of an RmsDtype, for host code: f(T{}) with T = __nv_bfloat16, __half or float.
template <typename F>
inline int rms_dispatch(int dtype, F&& f) {
    switch (dtype) {
        case RMS_BF16: return f(__nv_bfloat16{});
        case RMS_FP16: return f(__half{});
        default: return f(float{});
    }
}

template <typename T> constexpr const char* kDtypeName = sizeof(T) == 4 ? "fp32" : "16-bit";
template <> constexpr const char* kDtypeName<__nv_bfloat16> = "bf16";
template <> constexpr const char* kDtypeName<__half> = "fp16";
