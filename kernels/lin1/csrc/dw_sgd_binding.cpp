// Python's entry to dw_sgd.cu: checks the tensors, allocates CUTLASS's workspace from
// torch's caching allocator, launches on the current stream. No host-device sync.
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dw_sgd.h"

namespace {

void check(bool ok, std::string const& what) { TORCH_CHECK_VALUE(ok, "dw_sgd: ", what); }

void dw_sgd(torch::Tensor dy, torch::Tensor x, torch::Tensor master, torch::Tensor buf,
            torch::Tensor shadow, double lr, double momentum, int64_t variant) {
  for (auto const* t : {&dy, &x, &master, &buf, &shadow}) {
    check(t->is_cuda() && t->device() == dy.device(), "every tensor on dY's CUDA device");
    check(t->dim() == 2 && t->is_contiguous(), "2-D contiguous tensors");
    check(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "16-byte aligned tensors");
  }
  check(dy.scalar_type() == torch::kBFloat16 && x.scalar_type() == torch::kBFloat16 &&
            shadow.scalar_type() == torch::kBFloat16,
        "dY, X and the shadow weight are bf16");
  check(master.scalar_type() == torch::kFloat && buf.scalar_type() == torch::kFloat,
        "the master weights and momentum are fp32");
  int64_t k = dy.size(0), m = dy.size(1), n = x.size(1);
  check(x.size(0) == k, "dY [K, M] and X [K, N] share K (the batch)");
  for (auto const* t : {&master, &buf, &shadow})
    check(t->size(0) == m && t->size(1) == n, "master, momentum and shadow are [M, N]");
  check(m % 8 == 0 && n % 8 == 0 && k % 8 == 0, "M, N and K multiples of 8 (TMA's 16 bytes)");
  check(m < INT32_MAX && n < INT32_MAX && k < INT32_MAX, "M, N and K under 2^31");

  c10::cuda::CUDAGuard guard(dy.device());
  int major = 0, sms = 0, device = dy.get_device();
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  check(major == 9, "an sm90 GPU (H100, H200): the kernel is built for sm_90a");
  DwSgdProblem p{int(m), int(n), int(k), dy.data_ptr(), x.data_ptr(),
                 master.data_ptr<float>(), buf.data_ptr<float>(), shadow.data_ptr(),
                 float(lr), float(momentum), sms};
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  size_t bytes = 0;
  int status = dw_sgd_launch(p, int(variant), nullptr, 0, stream, &bytes);
  check(status == 0, "no such variant");
  auto workspace = torch::empty({int64_t(bytes) + 1}, dy.options().dtype(torch::kUInt8));
  status = dw_sgd_launch(p, int(variant), workspace.data_ptr(), bytes, stream, nullptr);
  check(status == 0, "CUTLASS refused the problem or the launch (status " +
                         std::to_string(status) + ")");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dw_sgd", &dw_sgd, "lin1's dW GEMM with the shadow SGD in its epilogue");
  m.def("variants", []() { return 4; });
}
