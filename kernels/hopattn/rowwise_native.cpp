// The pybind11 binding of Part II's rowwise lineages: loads an RMSNorm stage's shared library
// (kernels/rmsnorm/common/abi_rmsnorm.h) and calls its two exported functions, an RMSNorm backward
// stage's (kernels/rmsnorm_backward/common/abi_rmsnorm_backward.h) and its three, or a softmax stage's,
// forward or backward (kernels/softmax/common/abi_softmax.h), and its two. Host code only, built by
// hopattn.rowwise_build beside (never inside) the attention binding, native.cpp.
#include <dlfcn.h>

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "abi_rmsnorm_backward.h"  // includes abi_rmsnorm.h
#include "abi_softmax.h"

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

using BackwardWorkspaceFn = int (*)(const RmsNormBackwardParams*, int64_t*, char*, int);
using BackwardLaunchFn = int (*)(const RmsNormBackwardParams*, cudaStream_t, char*, int);
using BackwardDescribeFn = int (*)(const RmsNormBackwardParams*, RmsBackwardInfo*, char*, int);

// The tensors and sizes of a backward call, as Python passes them (pointers as integers, 0 for none).
struct BackwardArgs {
    uintptr_t x, weight, dy, rstd, drstd, dx, dw, workspace;
    int64_t workspace_bytes, rows, cols, x_stride, dy_stride, dx_stride;
    int dtype, num_sms;

    RmsNormBackwardParams params() const {
        RmsNormBackwardParams p{};
        p.x = reinterpret_cast<const void*>(x);
        p.weight = reinterpret_cast<const void*>(weight);
        p.dy = reinterpret_cast<const void*>(dy);
        p.rstd = reinterpret_cast<const float*>(rstd);
        p.drstd = reinterpret_cast<const float*>(drstd);
        p.dx = reinterpret_cast<void*>(dx);
        p.dw = reinterpret_cast<void*>(dw);
        p.workspace = reinterpret_cast<void*>(workspace);
        p.workspace_bytes = workspace_bytes;
        p.rows = rows;
        p.cols = cols;
        p.x_stride = x_stride;
        p.dy_stride = dy_stride;
        p.dx_stride = dx_stride;
        p.dtype = dtype;
        p.num_sms = num_sms;
        return p;
    }
};

class RmsNormBackwardLibrary {
public:
    explicit RmsNormBackwardLibrary(const std::string& path) : path_(path) {
        handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error("cannot load " + path + ": " + dlerror());
        workspace_ = reinterpret_cast<BackwardWorkspaceFn>(dlsym(handle_, "hopattn_rmsnorm_backward_workspace"));
        launch_ = reinterpret_cast<BackwardLaunchFn>(dlsym(handle_, "hopattn_rmsnorm_backward_launch"));
        describe_ = reinterpret_cast<BackwardDescribeFn>(dlsym(handle_, "hopattn_rmsnorm_backward_describe"));
        if (!workspace_ || !launch_ || !describe_)
            throw std::runtime_error(path + " does not export hopattn_rmsnorm_backward_workspace, _launch and _describe");
    }
    RmsNormBackwardLibrary(const RmsNormBackwardLibrary&) = delete;
    RmsNormBackwardLibrary& operator=(const RmsNormBackwardLibrary&) = delete;
    // Kernels may still be queued when Python drops the object: never dlclose.

    // Bytes of fp32 scratch a launch with these arguments needs (the occupancy it sizes its grid by
    // is the current device's).
    int64_t workspace(const BackwardArgs& a) const {
        const RmsNormBackwardParams p = a.params();
        int64_t bytes = 0;
        char err[512] = {0};
        if (workspace_(&p, &bytes, err, sizeof(err)) != 0)
            throw std::runtime_error(std::string("rmsnorm backward workspace failed: ") + err);
        return bytes;
    }

    void launch(const BackwardArgs& a, uintptr_t stream) const {
        const RmsNormBackwardParams p = a.params();
        char err[512] = {0};
        int status;
        {
            py::gil_scoped_release release;
            status = launch_(&p, reinterpret_cast<cudaStream_t>(stream), err, sizeof(err));
        }
        if (status != 0) throw std::runtime_error(std::string("rmsnorm backward stage launch failed: ") + err);
    }

    py::dict describe(const BackwardArgs& a) const {
        const RmsNormBackwardParams p = a.params();
        RmsBackwardInfo info{};
        char err[512] = {0};
        if (describe_(&p, &info, err, sizeof(err)) != 0) throw std::runtime_error(std::string("describe failed: ") + err);
        if (info.abi_version != HOPATTN_RMSNORM_BACKWARD_ABI_VERSION)
            throw std::runtime_error(path_ + " was built for rmsnorm backward ABI " + std::to_string(info.abi_version));
        py::dict d;
        d["variant"] = std::string(info.variant);
        d["threads"] = info.threads;
        d["rows_per_cta"] = info.rows_per_cta;
        d["threads_per_row"] = info.threads_per_row;
        d["cluster"] = info.cluster;
        d["vector_bytes"] = info.vector_bytes;
        d["elements_per_thread"] = info.elements_per_thread;
        d["ctas"] = info.ctas;
        d["partial_rows"] = info.partial_rows;
        d["reads"] = info.reads;
        d["dynamic_smem"] = info.dynamic_smem;
        d["static_smem"] = info.static_smem;
        d["registers"] = info.registers;
        d["max_threads"] = info.max_threads;
        d["local_bytes"] = info.local_bytes;
        d["sum_registers"] = info.sum_registers;
        d["sum_local_bytes"] = info.sum_local_bytes;
        return d;
    }

    const std::string& path() const { return path_; }

private:
    std::string path_;
    void* handle_ = nullptr;
    BackwardWorkspaceFn workspace_ = nullptr;
    BackwardLaunchFn launch_ = nullptr;
    BackwardDescribeFn describe_ = nullptr;
};

BackwardArgs backward_args(uintptr_t x, uintptr_t weight, uintptr_t dy, uintptr_t rstd, uintptr_t drstd, uintptr_t dx,
                           uintptr_t dw, uintptr_t workspace, int64_t workspace_bytes, int64_t rows, int64_t cols,
                           int64_t x_stride, int64_t dy_stride, int64_t dx_stride, int dtype, int num_sms) {
    return BackwardArgs{x, weight, dy, rstd, drstd, dx, dw, workspace, workspace_bytes, rows, cols,
                        x_stride, dy_stride, dx_stride, dtype, num_sms};
}

py::dict kernel_info(const RmsKernelInfo& info) {
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

// A softmax stage's library: the forward's two entry points, or the backward's.
class SoftmaxLibrary {
public:
    using LaunchFn = int (*)(const SoftmaxParams*, cudaStream_t, char*, int);
    using DescribeFn = int (*)(const SoftmaxParams*, RmsKernelInfo*, char*, int);
    using BackwardLaunchFn = int (*)(const SoftmaxBackwardParams*, cudaStream_t, char*, int);
    using BackwardDescribeFn = int (*)(const SoftmaxBackwardParams*, RmsKernelInfo*, char*, int);

    SoftmaxLibrary(const std::string& path, bool backward) : path_(path), backward_(backward) {
        handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error("cannot load " + path + ": " + dlerror());
        const char* launch = backward ? "hopattn_softmax_backward_launch" : "hopattn_softmax_launch";
        const char* describe = backward ? "hopattn_softmax_backward_describe" : "hopattn_softmax_describe";
        launch_ = dlsym(handle_, launch);
        describe_ = dlsym(handle_, describe);
        if (!launch_ || !describe_) throw std::runtime_error(path + " does not export " + launch + " and " + describe);
    }
    SoftmaxLibrary(const SoftmaxLibrary&) = delete;
    SoftmaxLibrary& operator=(const SoftmaxLibrary&) = delete;

    // The forward: y = softmax(x) over rows of cols elements.
    void launch(uintptr_t x, uintptr_t y, int64_t rows, int64_t cols, int64_t x_stride, int64_t y_stride, int dtype,
                int num_sms, uintptr_t stream) const {
        need(false);
        const SoftmaxParams p = forward_params(x, y, rows, cols, x_stride, y_stride, dtype, num_sms);
        char err[512] = {0};
        int status;
        {
            py::gil_scoped_release release;
            status = reinterpret_cast<LaunchFn>(launch_)(&p, reinterpret_cast<cudaStream_t>(stream), err, sizeof(err));
        }
        if (status != 0) throw std::runtime_error(std::string("softmax stage launch failed: ") + err);
    }

    py::dict describe(uintptr_t x, uintptr_t y, int64_t rows, int64_t cols, int64_t x_stride, int64_t y_stride,
                      int dtype) const {
        need(false);
        const SoftmaxParams p = forward_params(x, y, rows, cols, x_stride, y_stride, dtype, 0);
        RmsKernelInfo info{};
        char err[512] = {0};
        if (reinterpret_cast<DescribeFn>(describe_)(&p, &info, err, sizeof(err)) != 0)
            throw std::runtime_error(std::string("describe failed: ") + err);
        return checked(info);
    }

    // The backward: dx = y · (dy − Σ y · dy).
    void launch_backward(uintptr_t y, uintptr_t dy, uintptr_t dx, int64_t rows, int64_t cols, int64_t y_stride,
                         int64_t dy_stride, int64_t dx_stride, int dtype, int num_sms, uintptr_t stream) const {
        need(true);
        const SoftmaxBackwardParams p = backward_params(y, dy, dx, rows, cols, y_stride, dy_stride, dx_stride, dtype,
                                                        num_sms);
        char err[512] = {0};
        int status;
        {
            py::gil_scoped_release release;
            status = reinterpret_cast<BackwardLaunchFn>(launch_)(&p, reinterpret_cast<cudaStream_t>(stream), err,
                                                                 sizeof(err));
        }
        if (status != 0) throw std::runtime_error(std::string("softmax backward stage launch failed: ") + err);
    }

    py::dict describe_backward(uintptr_t y, uintptr_t dy, uintptr_t dx, int64_t rows, int64_t cols, int64_t y_stride,
                               int64_t dy_stride, int64_t dx_stride, int dtype) const {
        need(true);
        const SoftmaxBackwardParams p = backward_params(y, dy, dx, rows, cols, y_stride, dy_stride, dx_stride, dtype, 0);
        RmsKernelInfo info{};
        char err[512] = {0};
        if (reinterpret_cast<BackwardDescribeFn>(describe_)(&p, &info, err, sizeof(err)) != 0)
            throw std::runtime_error(std::string("describe failed: ") + err);
        return checked(info);
    }

    const std::string& path() const { return path_; }

private:
    static SoftmaxParams forward_params(uintptr_t x, uintptr_t y, int64_t rows, int64_t cols, int64_t x_stride,
                                        int64_t y_stride, int dtype, int num_sms) {
        SoftmaxParams p{};
        p.x = reinterpret_cast<const void*>(x);
        p.y = reinterpret_cast<void*>(y);
        p.rows = rows;
        p.cols = cols;
        p.x_stride = x_stride;
        p.y_stride = y_stride;
        p.dtype = dtype;
        p.num_sms = num_sms;
        return p;
    }

    static SoftmaxBackwardParams backward_params(uintptr_t y, uintptr_t dy, uintptr_t dx, int64_t rows, int64_t cols,
                                                 int64_t y_stride, int64_t dy_stride, int64_t dx_stride, int dtype,
                                                 int num_sms) {
        SoftmaxBackwardParams p{};
        p.y = reinterpret_cast<const void*>(y);
        p.dy = reinterpret_cast<const void*>(dy);
        p.dx = reinterpret_cast<void*>(dx);
        p.rows = rows;
        p.cols = cols;
        p.y_stride = y_stride;
        p.dy_stride = dy_stride;
        p.dx_stride = dx_stride;
        p.dtype = dtype;
        p.num_sms = num_sms;
        return p;
    }

    void need(bool backward) const {
        if (backward != backward_)
            throw std::runtime_error(path_ + (backward_ ? " is a backward stage" : " is a forward stage"));
    }

    py::dict checked(const RmsKernelInfo& info) const {
        if (info.abi_version != HOPATTN_SOFTMAX_ABI_VERSION)
            throw std::runtime_error(path_ + " was built for softmax ABI " + std::to_string(info.abi_version));
        return kernel_info(info);
    }

    std::string path_;
    bool backward_;
    void* handle_ = nullptr;
    void* launch_ = nullptr;
    void* describe_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_rowwise_native, m) {
    m.doc() = "hopattn rowwise binding: loads RMSNorm (forward and backward) stage libraries and launches their kernels";
    m.attr("RMSNORM_ABI_VERSION") = HOPATTN_RMSNORM_ABI_VERSION;
    m.attr("RMSNORM_BACKWARD_ABI_VERSION") = HOPATTN_RMSNORM_BACKWARD_ABI_VERSION;
    m.attr("SOFTMAX_ABI_VERSION") = HOPATTN_SOFTMAX_ABI_VERSION;
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
    py::class_<BackwardArgs>(m, "BackwardArgs");
    m.def("backward_args", &backward_args, py::arg("x"), py::arg("weight"), py::arg("dy"), py::arg("rstd"),
          py::arg("drstd"), py::arg("dx"), py::arg("dw"), py::arg("workspace"), py::arg("workspace_bytes"),
          py::arg("rows"), py::arg("cols"), py::arg("x_stride"), py::arg("dy_stride"), py::arg("dx_stride"),
          py::arg("dtype"), py::arg("num_sms"));
    py::class_<RmsNormBackwardLibrary>(m, "RmsNormBackwardLibrary")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def("workspace", &RmsNormBackwardLibrary::workspace, py::arg("args"))
        .def("launch", &RmsNormBackwardLibrary::launch, py::arg("args"), py::arg("stream"))
        .def("describe", &RmsNormBackwardLibrary::describe, py::arg("args"))
        .def_property_readonly("path", &RmsNormBackwardLibrary::path);
    py::class_<SoftmaxLibrary>(m, "SoftmaxLibrary")
        .def(py::init<const std::string&, bool>(), py::arg("path"), py::arg("backward"))
        .def("launch", &SoftmaxLibrary::launch, py::arg("x"), py::arg("y"), py::arg("rows"), py::arg("cols"),
             py::arg("x_stride"), py::arg("y_stride"), py::arg("dtype"), py::arg("num_sms"), py::arg("stream"))
        .def("describe", &SoftmaxLibrary::describe, py::arg("x"), py::arg("y"), py::arg("rows"), py::arg("cols"),
             py::arg("x_stride"), py::arg("y_stride"), py::arg("dtype"))
        .def("launch_backward", &SoftmaxLibrary::launch_backward, py::arg("y"), py::arg("dy"), py::arg("dx"),
             py::arg("rows"), py::arg("cols"), py::arg("y_stride"), py::arg("dy_stride"), py::arg("dx_stride"),
             py::arg("dtype"), py::arg("num_sms"), py::arg("stream"))
        .def("describe_backward", &SoftmaxLibrary::describe_backward, py::arg("y"), py::arg("dy"), py::arg("dx"),
             py::arg("rows"), py::arg("cols"), py::arg("y_stride"), py::arg("dy_stride"), py::arg("dx_stride"),
             py::arg("dtype"))
        .def_property_readonly("path", &SoftmaxLibrary::path);
}
