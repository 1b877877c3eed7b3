// The pybind11 binding: loads a stage's shared library and calls its two exported functions.
// Host code only, so it compiles in seconds and never needs rebuilding when a kernel changes.
#include <dlfcn.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <stdexcept>
#include <string>

#include "abi_backward.h"  // includes the forward's abi.h

namespace py = pybind11;

namespace {

using LaunchFn = int (*)(const AttnParams*, cudaStream_t, char*, int);
using DescribeFn = int (*)(KernelInfo*, char*, int);
// Exported only by builds with -DHOPATTN_TRACE (common/trace.cuh).
using TraceSetupFn = int (*)(void*, void*, void*, void*, int, int, int, char*, int);
using TraceCapacityFn = int (*)();

using Strides = std::array<int64_t, 3>;

// A forward launch's arguments but for its pointers, converted from Python once per call shape
// (api._prepared keeps one per checked call and strides): pybind11's conversion of the 19 arguments of launch()
// costs several µs a call, the launch in the stage library about 4 (research/host_cost.md).
struct PreparedLaunch {
    AttnParams params{};
};

class StageLibrary {
public:
    explicit StageLibrary(const std::string& path) : path_(path) {
        handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error("cannot load " + path + ": " + dlerror());
        launch_ = reinterpret_cast<LaunchFn>(dlsym(handle_, "hopattn_launch"));
        describe_ = reinterpret_cast<DescribeFn>(dlsym(handle_, "hopattn_describe"));
        if (!launch_ || !describe_)
            throw std::runtime_error(path + " does not export hopattn_launch and hopattn_describe");
        trace_setup_ = reinterpret_cast<TraceSetupFn>(dlsym(handle_, "hopattn_trace_setup"));
        trace_capacity_ = reinterpret_cast<TraceCapacityFn>(dlsym(handle_, "hopattn_trace_capacity"));
    }
    StageLibrary(const StageLibrary&) = delete;
    StageLibrary& operator=(const StageLibrary&) = delete;
    // Kernels may still be queued on a stream when Python drops the object: never dlclose.

    void launch(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, Strides q_stride, Strides k_stride,
                Strides v_stride, Strides o_stride, int batch, int heads, int len_q, int len_k, int head_dim,
                float scale, bool causal, int num_sms, uintptr_t stream, int kv_heads, uintptr_t lse) const {
        const PreparedLaunch prepared = prepare(q_stride, k_stride, v_stride, o_stride, batch, heads, len_q, len_k,
                                                head_dim, scale, causal, num_sms, kv_heads);
        launch_prepared(prepared, q, k, v, o, lse, stream);
    }

    static PreparedLaunch prepare(Strides q_stride, Strides k_stride, Strides v_stride, Strides o_stride, int batch,
                                  int heads, int len_q, int len_k, int head_dim, float scale, bool causal, int num_sms,
                                  int kv_heads) {
        PreparedLaunch prepared;
        AttnParams& p = prepared.params;
        for (int i = 0; i < 3; ++i) {
            p.q_stride[i] = q_stride[i];
            p.k_stride[i] = k_stride[i];
            p.v_stride[i] = v_stride[i];
            p.o_stride[i] = o_stride[i];
        }
        p.batch = batch;
        p.heads = heads;
        p.len_q = len_q;
        p.len_k = len_k;
        p.head_dim = head_dim;
        p.scale = scale;
        p.causal = causal ? 1 : 0;
        p.num_sms = num_sms;
        p.kv_heads = kv_heads;
        return prepared;
    }

    // The prepared arguments with this call's pointers (lse 0: not written).
    void launch_prepared(const PreparedLaunch& prepared, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o,
                         uintptr_t lse, uintptr_t stream) const {
        AttnParams p = prepared.params;
        p.q = reinterpret_cast<const void*>(q);
        p.k = reinterpret_cast<const void*>(k);
        p.v = reinterpret_cast<const void*>(v);
        p.o = reinterpret_cast<void*>(o);
        p.lse = reinterpret_cast<float*>(lse);
        char err[512] = {0};
        int status;
        {
            py::gil_scoped_release release;
            status = launch_(&p, reinterpret_cast<cudaStream_t>(stream), err, sizeof(err));
        }
        if (status != 0) throw std::runtime_error(std::string("stage launch failed: ") + err);
    }

    py::dict describe() const {
        KernelInfo info{};
        char err[512] = {0};
        if (describe_(&info, err, sizeof(err)) != 0) throw std::runtime_error(std::string("describe failed: ") + err);
        if (info.abi_version != HOPATTN_ABI_VERSION)
            throw std::runtime_error(path_ + " was built for ABI " + std::to_string(info.abi_version));
        py::dict d;
        d["threads"] = info.threads;
        d["dynamic_smem"] = info.dynamic_smem;
        d["static_smem"] = info.static_smem;
        d["registers"] = info.registers;
        d["max_threads"] = info.max_threads;
        d["local_bytes"] = info.local_bytes;
        d["block_m"] = info.block_m;
        d["block_n"] = info.block_n;
        return d;
    }

    // Traced builds: where the next launch records to (device pointers), and records per warp.
    bool traced() const { return trace_setup_ != nullptr; }
    void trace_setup(uintptr_t events, uintptr_t base, uintptr_t info, uintptr_t slots, int max_ctas, int warps,
                     int target_sm) const {
        if (!trace_setup_) throw std::runtime_error(path_ + " was not built with -DHOPATTN_TRACE");
        char err[512] = {0};
        if (trace_setup_(reinterpret_cast<void*>(events), reinterpret_cast<void*>(base), reinterpret_cast<void*>(info),
                         reinterpret_cast<void*>(slots), max_ctas, warps, target_sm, err, sizeof(err)) != 0)
            throw std::runtime_error(err);
    }
    int trace_capacity() const {
        if (!trace_capacity_) throw std::runtime_error(path_ + " was not built with -DHOPATTN_TRACE");
        return trace_capacity_();
    }

    const std::string& path() const { return path_; }

private:
    std::string path_;
    void* handle_ = nullptr;
    LaunchFn launch_ = nullptr;
    DescribeFn describe_ = nullptr;
    TraceSetupFn trace_setup_ = nullptr;
    TraceCapacityFn trace_capacity_ = nullptr;
};

// A backward stage's library: the same loading, its own launch (kernels/attention_backward/common/abi_backward.h).
using BackwardLaunchFn = int (*)(const AttnBwdParams*, cudaStream_t, char*, int);
using BackwardWorkspaceFn = int (*)(const AttnBwdParams*, int64_t*, int64_t*);

class BackwardLibrary {
public:
    explicit BackwardLibrary(const std::string& path) : path_(path) {
        handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error("cannot load " + path + ": " + dlerror());
        launch_ = reinterpret_cast<BackwardLaunchFn>(dlsym(handle_, "hopattn_backward_launch"));
        workspace_ = reinterpret_cast<BackwardWorkspaceFn>(dlsym(handle_, "hopattn_backward_workspace"));
        describe_ = reinterpret_cast<DescribeFn>(dlsym(handle_, "hopattn_describe"));
        if (!launch_ || !workspace_ || !describe_)
            throw std::runtime_error(path + " does not export hopattn_backward_launch, hopattn_backward_workspace and "
                                            "hopattn_describe");
        trace_setup_ = reinterpret_cast<TraceSetupFn>(dlsym(handle_, "hopattn_trace_setup"));
        trace_capacity_ = reinterpret_cast<TraceCapacityFn>(dlsym(handle_, "hopattn_trace_capacity"));
    }
    BackwardLibrary(const BackwardLibrary&) = delete;
    BackwardLibrary& operator=(const BackwardLibrary&) = delete;

    // (row_stats floats, dq_accum floats) the launch needs for these sizes. kv_heads too: from stage 05
    // on the row_stats workspace ends with a key-block ticket per (batch, K/V head).
    std::pair<int64_t, int64_t> workspace(int batch, int heads, int kv_heads, int len_q, bool deterministic) const {
        if (kv_heads <= 0 || kv_heads > heads)
            throw std::invalid_argument("kv_heads: expected 1 to heads (" + std::to_string(heads) + "), got " +
                                        std::to_string(kv_heads));
        AttnBwdParams p{};
        p.batch = batch;
        p.heads = heads;
        p.kv_heads = kv_heads;
        p.len_q = len_q;
        p.deterministic = deterministic ? 1 : 0;
        int64_t stats = 0, accum = 0;
        workspace_(&p, &stats, &accum);
        return {stats, accum};
    }

    // tensors: q, k, v, o, dout, dq, dk, dv (pointers and strides in that order).
    void launch(std::array<uintptr_t, 8> ptr, std::array<Strides, 8> strides, uintptr_t lse, uintptr_t dlse,
                uintptr_t row_stats, uintptr_t dq_accum, int batch, int heads, int kv_heads, int len_q, int len_k,
                int head_dim, float scale, bool causal, bool deterministic, int num_sms, uintptr_t stream) const {
        AttnBwdParams p{};
        p.q = reinterpret_cast<const void*>(ptr[0]);
        p.k = reinterpret_cast<const void*>(ptr[1]);
        p.v = reinterpret_cast<const void*>(ptr[2]);
        p.o = reinterpret_cast<const void*>(ptr[3]);
        p.dout = reinterpret_cast<const void*>(ptr[4]);
        p.dq = reinterpret_cast<void*>(ptr[5]);
        p.dk = reinterpret_cast<void*>(ptr[6]);
        p.dv = reinterpret_cast<void*>(ptr[7]);
        int64_t* dst[8] = {p.q_stride, p.k_stride, p.v_stride, p.o_stride, p.dout_stride, p.dq_stride, p.dk_stride,
                           p.dv_stride};
        for (int t = 0; t < 8; ++t)
            for (int i = 0; i < 3; ++i) dst[t][i] = strides[t][i];
        p.lse = reinterpret_cast<const float*>(lse);
        p.dlse = reinterpret_cast<const float*>(dlse);
        p.row_stats = reinterpret_cast<float*>(row_stats);
        p.dq_accum = reinterpret_cast<float*>(dq_accum);
        p.batch = batch;
        p.heads = heads;
        p.kv_heads = kv_heads;
        p.len_q = len_q;
        p.len_k = len_k;
        p.head_dim = head_dim;
        p.scale = scale;
        p.causal = causal ? 1 : 0;
        p.deterministic = deterministic ? 1 : 0;
        p.num_sms = num_sms;
        char err[512] = {0};
        int status;
        {
            py::gil_scoped_release release;
            status = launch_(&p, reinterpret_cast<cudaStream_t>(stream), err, sizeof(err));
        }
        if (status != 0) throw std::runtime_error(std::string("backward stage launch failed: ") + err);
    }

    py::dict describe() const {
        KernelInfo info{};
        char err[512] = {0};
        if (describe_(&info, err, sizeof(err)) != 0) throw std::runtime_error(std::string("describe failed: ") + err);
        if (info.abi_version != HOPATTN_ABI_VERSION)
            throw std::runtime_error(path_ + " was built for ABI " + std::to_string(info.abi_version));
        py::dict d;
        d["threads"] = info.threads;
        d["dynamic_smem"] = info.dynamic_smem;
        d["static_smem"] = info.static_smem;
        d["registers"] = info.registers;
        d["max_threads"] = info.max_threads;
        d["local_bytes"] = info.local_bytes;
        d["block_m"] = info.block_m;
        d["block_n"] = info.block_n;
        return d;
    }

    // Traced builds (the backward's recorder, common/trace_recorder_backward.cuh): as StageLibrary's.
    bool traced() const { return trace_setup_ != nullptr; }
    void trace_setup(uintptr_t events, uintptr_t base, uintptr_t info, uintptr_t slots, int max_ctas, int warps,
                     int target_sm) const {
        if (!trace_setup_) throw std::runtime_error(path_ + " was not built with -DHOPATTN_TRACE");
        char err[512] = {0};
        if (trace_setup_(reinterpret_cast<void*>(events), reinterpret_cast<void*>(base), reinterpret_cast<void*>(info),
                         reinterpret_cast<void*>(slots), max_ctas, warps, target_sm, err, sizeof(err)) != 0)
            throw std::runtime_error(err);
    }
    int trace_capacity() const {
        if (!trace_capacity_) throw std::runtime_error(path_ + " was not built with -DHOPATTN_TRACE");
        return trace_capacity_();
    }

    const std::string& path() const { return path_; }

private:
    std::string path_;
    void* handle_ = nullptr;
    BackwardLaunchFn launch_ = nullptr;
    BackwardWorkspaceFn workspace_ = nullptr;
    DescribeFn describe_ = nullptr;
    TraceSetupFn trace_setup_ = nullptr;
    TraceCapacityFn trace_capacity_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "hopattn binding: loads stage libraries and launches their kernels";
    m.attr("ABI_VERSION") = HOPATTN_ABI_VERSION;
    py::class_<PreparedLaunch>(m, "PreparedLaunch");
    py::class_<StageLibrary>(m, "StageLibrary")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def("launch", &StageLibrary::launch, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"),
             py::arg("q_stride"), py::arg("k_stride"), py::arg("v_stride"), py::arg("o_stride"), py::arg("batch"),
             py::arg("heads"), py::arg("len_q"), py::arg("len_k"), py::arg("head_dim"), py::arg("scale"),
             py::arg("causal"), py::arg("num_sms"), py::arg("stream"), py::arg("kv_heads"), py::arg("lse"))
        .def_static("prepare", &StageLibrary::prepare, py::arg("q_stride"), py::arg("k_stride"), py::arg("v_stride"),
                    py::arg("o_stride"), py::arg("batch"), py::arg("heads"), py::arg("len_q"), py::arg("len_k"),
                    py::arg("head_dim"), py::arg("scale"), py::arg("causal"), py::arg("num_sms"), py::arg("kv_heads"))
        .def("launch_prepared", &StageLibrary::launch_prepared)  // positional: (prepared, q, k, v, o, lse, stream)
        .def("describe", &StageLibrary::describe)
        .def_property_readonly("traced", &StageLibrary::traced)
        .def("trace_setup", &StageLibrary::trace_setup, py::arg("events"), py::arg("base"), py::arg("info"),
             py::arg("slots"), py::arg("max_ctas"), py::arg("warps"), py::arg("target_sm"))
        .def("trace_capacity", &StageLibrary::trace_capacity)
        .def_property_readonly("path", &StageLibrary::path);
    m.attr("BACKWARD_ABI_VERSION") = HOPATTN_BACKWARD_ABI_VERSION;
    py::class_<BackwardLibrary>(m, "BackwardLibrary")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def("workspace", &BackwardLibrary::workspace, py::arg("batch"), py::arg("heads"), py::arg("kv_heads"),
             py::arg("len_q"), py::arg("deterministic"))
        .def("launch", &BackwardLibrary::launch, py::arg("pointers"), py::arg("strides"), py::arg("lse"),
             py::arg("dlse"), py::arg("row_stats"), py::arg("dq_accum"), py::arg("batch"), py::arg("heads"),
             py::arg("kv_heads"), py::arg("len_q"), py::arg("len_k"), py::arg("head_dim"), py::arg("scale"),
             py::arg("causal"), py::arg("deterministic"), py::arg("num_sms"), py::arg("stream"))
        .def("describe", &BackwardLibrary::describe)
        .def_property_readonly("traced", &BackwardLibrary::traced)
        .def("trace_setup", &BackwardLibrary::trace_setup, py::arg("events"), py::arg("base"), py::arg("info"),
             py::arg("slots"), py::arg("max_ctas"), py::arg("warps"), py::arg("target_sm"))
        .def("trace_capacity", &BackwardLibrary::trace_capacity)
        .def_property_readonly("path", &BackwardLibrary::path);
}
