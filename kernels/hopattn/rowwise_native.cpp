// The pybind11 binding of Part II's rowwise lineages: loads an RMSNorm stage's shared library
// (kernels/rmsnorm/common/abi_rmsnorm.h) and calls its two exported functions. Host code only,
// built by hopattn.rowwise_build beside (never inside) the attention binding, native.cpp.
#include <dlfcn.h>

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "abi_rmsnorm.h"

namespace py = pybind11;

namespace {

using LaunchFn = int (*)(const RmsNormParams*, cudaStream_t, char*, int);
using DescribeFn = int (*)(const RmsNormParams*, RmsKernelInfo*, char*, int);

RmsNormParams make_params(uintptr_t x, uintptr_t weight, uintptr_t out, uintptr_t rstd, int64_t rows, int64_t cols,
                          int64_t x_stride, int64_t out_stride, float eps, int dtype, int num_sms) {
    RmsNormParams p{};
    p.x = reinterpret_cast<const void*>(x);
    p.weight = reinterpret_cast<const void*>(weight);
    p.out = reinterpret_cast<void*>(out);
    p.rstd = reinterpret_cast<float*>(rstd);
    p.rows = rows;
    p.cols = cols;
    p.x_stride = x_stride;
    p.out_stride = out_stride;
    p.eps = eps;
    p.dtype = dtype;
    p.num_sms = num_sms;
    return p;
}

class RmsNormLibrary {
public:
    explicit RmsNormLibrary(const std::string& path) : path_(path) {
        handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error("cannot load " + path + ": " + dlerror());
        launch_ = reinterpret_cast<LaunchFn>(dlsym(handle_, "hopattn_rmsnorm_launch"));
        describe_ = reinterpret_cast<DescribeFn>(dlsym(handle_, "hopattn_rmsnorm_describe"));
        if (!launch_ || !describe_)
            throw std::runtime_error(path + " does not export hopattn_rmsnorm_launch and hopattn_rmsnorm_describe");
    }
    RmsNormLibrary(const RmsNormLibrary&) = delete;
    RmsNormLibrary& operator=(const RmsNormLibrary&) = delete;
    // Kernels may still be queued when Python drops the object: never dlclose.

    void launch(uintptr_t x, uintptr_t weight, uintptr_t out, uintptr_t rstd, int64_t rows, int64_t cols,
                int64_t x_stride, int64_t out_stride, float eps, int dtype, int num_sms, uintptr_t stream) const {
        const RmsNormParams p = make_params(x, weight, out, rstd, rows, cols, x_stride, out_stride, eps, dtype, num_sms);
        char err[512] = {0};
        int status;
        {
            py::gil_scoped_release release;
            status = launch_(&p, reinterpret_cast<cudaStream_t>(stream), err, sizeof(err));
        }
        if (status != 0) throw std::runtime_error(std::string("rmsnorm stage launch failed: ") + err);
    }

    // The kernel a launch with these parameters would run, and its compiled attributes.
    py::dict describe(uintptr_t x, uintptr_t weight, uintptr_t out, int64_t rows, int64_t cols, int64_t x_stride,
                      int64_t out_stride, int dtype) const {
        const RmsNormParams p = make_params(x, weight, out, 0, rows, cols, x_stride, out_stride, 1e-6f, dtype, 0);
        RmsKernelInfo info{};
        char err[512] = {0};
        if (describe_(&p, &info, err, sizeof(err)) != 0) throw std::runtime_error(std::string("describe failed: ") + err);
        if (info.abi_version != HOPATTN_RMSNORM_ABI_VERSION)
            throw std::runtime_error(path_ + " was built for rmsnorm ABI " + std::to_string(info.abi_version));
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
    std::string path_;
    void* handle_ = nullptr;
    LaunchFn launch_ = nullptr;
    DescribeFn describe_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_rowwise_native, m) {
    m.doc() = "hopattn rowwise binding: loads RMSNorm stage libraries and launches their kernels";
    m.attr("RMSNORM_ABI_VERSION") = HOPATTN_RMSNORM_ABI_VERSION;
    m.attr("BF16") = (int)RMS_BF16;
    m.attr("FP16") = (int)RMS_FP16;
    m.attr("FP32") = (int)RMS_FP32;
    py::class_<RmsNormLibrary>(m, "RmsNormLibrary")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def("launch", &RmsNormLibrary::launch, py::arg("x"), py::arg("weight"), py::arg("out"), py::arg("rstd"),
             py::arg("rows"), py::arg("cols"), py::arg("x_stride"), py::arg("out_stride"), py::arg("eps"),
             py::arg("dtype"), py::arg("num_sms"), py::arg("stream"))
        .def("describe", &RmsNormLibrary::describe, py::arg("x"), py::arg("weight"), py::arg("out"), py::arg("rows"),
             py::arg("cols"), py::arg("x_stride"), py::arg("out_stride"), py::arg("dtype"))
        .def_property_readonly("path", &RmsNormLibrary::path);
}
