// The pybind11 binding of the cross-entropy lineage (abi_cross_entropy.h): loads a stage's shared
// library and calls its two exported functions. Host code only, built by hopattn.cross_entropy_ops
// (_native) beside the rowwise binding (rowwise_native.cpp), which it leaves as it is; at the join its
// class can move into rowwise_native.cpp as a new class (no existing signature changes).
#include <dlfcn.h>

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "abi_cross_entropy.h"

namespace py = pybind11;

namespace {

class CrossEntropyLibrary {
public:
    using LaunchFn = int (*)(const CrossEntropyParams*, cudaStream_t, char*, int);
    using DescribeFn = int (*)(const CrossEntropyParams*, RmsKernelInfo*, char*, int);

    explicit CrossEntropyLibrary(const std::string& path) : path_(path) {
        handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error("cannot load " + path + ": " + dlerror());
        launch_ = reinterpret_cast<LaunchFn>(dlsym(handle_, "hopattn_cross_entropy_launch"));
        describe_ = reinterpret_cast<DescribeFn>(dlsym(handle_, "hopattn_cross_entropy_describe"));
        if (!launch_ || !describe_)
            throw std::runtime_error(path + " does not export hopattn_cross_entropy_launch and "
                                            "hopattn_cross_entropy_describe");
    }
    CrossEntropyLibrary(const CrossEntropyLibrary&) = delete;
    CrossEntropyLibrary& operator=(const CrossEntropyLibrary&) = delete;
    // Kernels may still be queued when Python drops the object: never dlclose.

    void launch(uintptr_t logits, uintptr_t targets, uintptr_t loss, uintptr_t lse, uintptr_t dlogits, uintptr_t dloss,
                int64_t rows, int64_t cols, int64_t logits_stride, int64_t dlogits_stride, int64_t dloss_stride,
                int64_t ignore_index, float label_smoothing, float grad_scale, int dtype, int num_sms,
                uintptr_t stream) const {
        const CrossEntropyParams p = params(logits, targets, loss, lse, dlogits, dloss, rows, cols, logits_stride,
                                            dlogits_stride, dloss_stride, ignore_index, label_smoothing, grad_scale,
                                            dtype, num_sms);
        char err[512] = {0};
        int status;
        {
            py::gil_scoped_release release;
            status = launch_(&p, reinterpret_cast<cudaStream_t>(stream), err, sizeof(err));
        }
        if (status != 0) throw std::runtime_error(std::string("cross-entropy stage launch failed: ") + err);
    }

    // The kernel a launch with these parameters would run (with the gradient or without), and its
    // compiled attributes.
    py::dict describe(uintptr_t logits, uintptr_t dlogits, int64_t rows, int64_t cols, int64_t logits_stride,
                      int64_t dlogits_stride, int dtype) const {
        const CrossEntropyParams p = params(logits, 16, 16, 0, dlogits, 0, rows, cols, logits_stride, dlogits_stride,
                                            0, -100, 0.0f, 1.0f, dtype, 0);
        RmsKernelInfo info{};
        char err[512] = {0};
        if (describe_(&p, &info, err, sizeof(err)) != 0) throw std::runtime_error(std::string("describe failed: ") + err);
        if (info.abi_version != HOPATTN_CROSS_ENTROPY_ABI_VERSION)
            throw std::runtime_error(path_ + " was built for cross-entropy ABI " + std::to_string(info.abi_version));
        py::dict d;
        d["variant"] = std::string(info.variant);
        d["threads"] = info.threads;
        d["rows_per_cta"] = info.rows_per_cta;
        d["threads_per_row"] = info.threads_per_row;
        d["cluster"] = info.cluster;
        d["vector_bytes"] = info.vector_bytes;
        d["elements_per_thread"] = info.elements_per_thread;
        d["dynamic_smem"] = info.dynamic_smem;
        d["static_smem"] = info.static_smem;
        d["registers"] = info.registers;
        d["max_threads"] = info.max_threads;
        d["local_bytes"] = info.local_bytes;
        return d;
    }

    const std::string& path() const { return path_; }

private:
    static CrossEntropyParams params(uintptr_t logits, uintptr_t targets, uintptr_t loss, uintptr_t lse,
                                     uintptr_t dlogits, uintptr_t dloss, int64_t rows, int64_t cols,
                                     int64_t logits_stride, int64_t dlogits_stride, int64_t dloss_stride,
                                     int64_t ignore_index, float label_smoothing, float grad_scale, int dtype,
                                     int num_sms) {
        CrossEntropyParams p{};
        p.logits = reinterpret_cast<const void*>(logits);
        p.targets = reinterpret_cast<const int64_t*>(targets);
        p.loss = reinterpret_cast<float*>(loss);
        p.lse = reinterpret_cast<float*>(lse);
        p.dlogits = reinterpret_cast<void*>(dlogits);
        p.dloss = reinterpret_cast<const float*>(dloss);
        p.rows = rows;
        p.cols = cols;
        p.logits_stride = logits_stride;
        p.dlogits_stride = dlogits_stride;
        p.dloss_stride = dloss_stride;
        p.ignore_index = ignore_index;
        p.label_smoothing = label_smoothing;
        p.grad_scale = grad_scale;
        p.dtype = dtype;
        p.num_sms = num_sms;
        return p;
    }

    std::string path_;
    void* handle_ = nullptr;
    LaunchFn launch_ = nullptr;
    DescribeFn describe_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_cross_entropy_native, m) {
    m.doc() = "hopattn cross-entropy binding: loads a cross-entropy stage library and launches its kernels";
    m.attr("CROSS_ENTROPY_ABI_VERSION") = HOPATTN_CROSS_ENTROPY_ABI_VERSION;
    py::class_<CrossEntropyLibrary>(m, "CrossEntropyLibrary")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def("launch", &CrossEntropyLibrary::launch, py::arg("logits"), py::arg("targets"), py::arg("loss"),
             py::arg("lse"), py::arg("dlogits"), py::arg("dloss"), py::arg("rows"), py::arg("cols"),
             py::arg("logits_stride"), py::arg("dlogits_stride"), py::arg("dloss_stride"), py::arg("ignore_index"),
             py::arg("label_smoothing"), py::arg("grad_scale"), py::arg("dtype"), py::arg("num_sms"),
             py::arg("stream"))
        .def("describe", &CrossEntropyLibrary::describe, py::arg("logits"), py::arg("dlogits"), py::arg("rows"),
             py::arg("cols"), py::arg("logits_stride"), py::arg("dlogits_stride"), py::arg("dtype"))
        .def_property_readonly("path", &CrossEntropyLibrary::path);
}
