// The launcher of dw_sgd.cu, free of torch (dw_sgd_binding.cpp includes it).
#pragma once
#include <cstddef>
#include <cuda_runtime.h>

struct DwSgdProblem {
  int m, n, k;           // out features, in features, batch
  void const* dy;        // bf16 [k, m] row-major
  void const* x;         // bf16 [k, n] row-major
  float* master;         // fp32 [m, n], updated in place
  float* buf;            // fp32 [m, n] momentum, updated in place (zeros before the first step)
  void* shadow;          // bf16 [m, n], written
  float lr, momentum;
  int sms;               // the device's multiprocessor count
};

enum DwSgdError {
  DW_SGD_SMALL_WORKSPACE = 1,
  DW_SGD_CANNOT_IMPLEMENT = 2,
  DW_SGD_INIT_FAILED = 3,
  DW_SGD_LAUNCH_FAILED = 4,
  DW_SGD_NO_VARIANT = 5,
};

// Returns 0 or a DwSgdError. With workspace_needed set, only writes the workspace's size.
int dw_sgd_launch(DwSgdProblem const& p, int variant, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, size_t* workspace_needed);
int dw_sgd_launch_more(DwSgdProblem const& p, int variant, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream, size_t* workspace_needed);
