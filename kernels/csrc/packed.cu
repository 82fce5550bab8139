// Fused GIoU loss over the packed layout in CUDA C++, the twin of kernels/triton_packed.py
// (its docstring has the layout, the contract and the byte ledger): the batch's N boxes
// [N, 4] with index [2, N] (each box's image, then its slot), predictions [B, M, 4].
//
// Ops: giou_cuda::packed_loss -> (loss, denom): one block per kThreads boxes writes two
// partials (the terms' sum and how many of its boxes were out of range), then one block
// sums them; giou_cuda::packed_loss_backward -> grad: a zero fill, then one thread per box
// scatters its gradient row. Every launch goes on the current stream, then a launch check.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "giou_common.cuh"

namespace {

constexpr int kThreads = 256;            // boxes per block, one a thread
constexpr int kFinalizeThreads = 1024;

struct PackedStrides {
  int64_t pb, pm, pc, bn, bc, i_row, i_box;
};

// Box i's image and slot, and whether they lie inside the predictions [B, M].
struct Place {
  int64_t image, slot;
  bool ok;
};

template <typename index_t>
__device__ __forceinline__ Place place_of(const index_t* index, int64_t i, int64_t B,
                                                   int64_t M, const PackedStrides& s) {
  const int64_t image = index[i * s.i_box], slot = index[s.i_row + i * s.i_box];
  return {image, slot, image >= 0 && image < B && slot >= 0 && slot < M};
}

template <typename scalar_t, typename target_t, typename acc_t>
__device__ __forceinline__ Boxes<acc_t> load_box(const scalar_t* pred, const target_t* boxes,
                                                 int64_t i, int64_t image, int64_t slot,
                                                 const PackedStrides& s) {
  const scalar_t* p = pred + image * s.pb + slot * s.pm;
  const target_t* t = boxes + i * s.bn;
  return {static_cast<acc_t>(p[0]), static_cast<acc_t>(p[s.pc]),
          static_cast<acc_t>(p[2 * s.pc]), static_cast<acc_t>(p[3 * s.pc]),
          static_cast<acc_t>(t[0]), static_cast<acc_t>(t[s.bc]),
          static_cast<acc_t>(t[2 * s.bc]), static_cast<acc_t>(t[3 * s.bc])};
}

// partial[block] = the block's boxes' sum of 1 - GIoU; partial[P + block] = how many of
// them name a place outside the predictions (never read).
template <typename scalar_t, typename target_t, typename index_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    packed_fwd_kernel(const scalar_t* __restrict__ pred, const target_t* __restrict__ boxes,
                      const index_t* __restrict__ index, acc_t* __restrict__ partial, int64_t N,
                      int64_t B, int64_t M, PackedStrides s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  acc_t term = 0, bad = 0;
  if (i < N) {
    const Place at = place_of(index, i, B, M, s);
    if (at.ok) {
      term = giou_term(load_box<scalar_t, target_t, acc_t>(pred, boxes, i, at.image, at.slot, s));
    } else {
      bad = 1;
    }
  }
  term = block_sum(term);
  __syncthreads();  // block_sum's shared buffer is reused below
  bad = block_sum(bad);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = term;
    partial[gridDim.x + blockIdx.x] = bad;
  }
}

// One block: loss = sum / denom, denom = max(N, 1), or NaN if a box was out of range (the
// backward then makes every box's gradient NaN). A fixed order: deterministic.
template <typename acc_t>
__global__ void packed_finalize_kernel(const acc_t* __restrict__ partial, int64_t P, int64_t N,
                                       acc_t* __restrict__ loss, acc_t* __restrict__ denom) {
  acc_t sum = 0, bad = 0;
  for (int64_t k = threadIdx.x; k < P; k += blockDim.x) {
    sum += partial[k];
    bad += partial[P + k];
  }
  sum = block_sum(sum);
  __syncthreads();
  bad = block_sum(bad);
  if (threadIdx.x == 0) {
    const acc_t d = bad > 0 ? acc_t(NAN) : static_cast<acc_t>(N > 1 ? N : 1);
    *loss = sum / d;
    *denom = d;
  }
}

// grad[image, slot] for each box in range; the gradient is contiguous and zero elsewhere.
template <typename scalar_t, typename target_t, typename index_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    packed_bwd_kernel(const acc_t* __restrict__ grad_loss, const acc_t* __restrict__ denom,
                      const scalar_t* __restrict__ pred, const target_t* __restrict__ boxes,
                      const index_t* __restrict__ index, scalar_t* __restrict__ grad, int64_t N,
                      int64_t B, int64_t M, PackedStrides s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= N) return;
  const Place at = place_of(index, i, B, M, s);
  if (!at.ok) return;
  acc_t g[4];
  slot_gradient(load_box<scalar_t, target_t, acc_t>(pred, boxes, i, at.image, at.slot, s),
                -(*grad_loss) / (*denom), g);
  store_row(grad + (at.image * M + at.slot) * 4, g);
}

void check_packed_inputs(const at::Tensor& pred, const at::Tensor& boxes,
                         const at::Tensor& index) {
  TORCH_CHECK(pred.is_cuda(), "giou_cuda: predictions must be a CUDA tensor, got ",
              pred.device(), " (the CUDA backend needs a CUDA GPU)");
  TORCH_CHECK(pred.dim() == 3 && pred.size(2) == 4,
              "giou_cuda: predictions must be [batch, slots, 4], got ", shape_of(pred));
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4,
              "giou_cuda: packed targets must be [boxes, 4], got ", shape_of(boxes));
  TORCH_CHECK(index.dim() == 2 && index.size(0) == 2 && index.size(1) == boxes.size(0),
              "giou_cuda: the packed index must be [2, ", std::to_string(boxes.size(0)),
              "], got ", shape_of(index));
  TORCH_CHECK(index.scalar_type() == at::kInt || index.scalar_type() == at::kLong,
              "giou_cuda: the packed index must be int32 or int64, got ", index.scalar_type());
  TORCH_CHECK(boxes.device() == pred.device() && index.device() == pred.device(),
              "giou_cuda: predictions, targets and index must be on one device, got ",
              pred.device(), ", ", boxes.device(), " and ", index.device());
}

PackedStrides packed_strides(const at::Tensor& pred, const at::Tensor& boxes,
                             const at::Tensor& index) {
  return {pred.stride(0), pred.stride(1), pred.stride(2), boxes.stride(0), boxes.stride(1),
          index.stride(0), index.stride(1)};
}

int64_t blocks_for(int64_t N) { return (N + kThreads - 1) / kThreads; }

#define PACKED_DISPATCH(PRED, BOXES, INDEX, NAME, ...)                                \
  GIOU_DISPATCH(PRED, BOXES, NAME, [&] {                                                \
    if (INDEX.scalar_type() == at::kLong) {                                             \
      using index_t = int64_t;                                                          \
      __VA_ARGS__();                                                                    \
    } else {                                                                            \
      using index_t = int32_t;                                                          \
      __VA_ARGS__();                                                                    \
    }                                                                                   \
  })

std::tuple<at::Tensor, at::Tensor> packed_loss_cuda(const at::Tensor& pred,
                                                    const at::Tensor& boxes,
                                                    const at::Tensor& index) {
  check_packed_inputs(pred, boxes, index);
  const c10::cuda::CUDAGuard guard(pred.device());
  const int64_t N = boxes.size(0), B = pred.size(0), M = pred.size(1);
  const int64_t P = blocks_for(N);
  TORCH_CHECK(P <= 0x7fffffff, "giou_cuda: too many packed boxes: ", std::to_string(N));
  const auto opts = pred.options().dtype(acc_type_of(pred));
  at::Tensor partial = at::empty({2 * P}, opts);
  at::Tensor loss = at::empty({}, opts), denom = at::empty({}, opts);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const PackedStrides s = packed_strides(pred, boxes, index);
  PACKED_DISPATCH(pred, boxes, index, "packed_loss_cuda", [&] {
    if (P > 0) {
      packed_fwd_kernel<pred_t, target_t, index_t, acc_t><<<P, kThreads, 0, stream>>>(
          pred.data_ptr<pred_t>(), boxes.data_ptr<target_t>(), index.data_ptr<index_t>(),
          partial.data_ptr<acc_t>(), N, B, M, s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    packed_finalize_kernel<acc_t><<<1, kFinalizeThreads, 0, stream>>>(
        partial.data_ptr<acc_t>(), P, N, loss.data_ptr<acc_t>(), denom.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {loss, denom};
}

at::Tensor packed_loss_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& denom,
                                     const at::Tensor& pred, const at::Tensor& boxes,
                                     const at::Tensor& index) {
  check_packed_inputs(pred, boxes, index);
  TORCH_CHECK(grad_loss.numel() == 1 && denom.numel() == 1,
              "giou_cuda: grad and denom must be scalars");
  TORCH_CHECK(grad_loss.device() == pred.device() && denom.device() == pred.device(),
              "giou_cuda: grad and denom must be on the predictions' device");
  const c10::cuda::CUDAGuard guard(pred.device());
  const auto acc = acc_type_of(pred);
  const at::Tensor g = grad_loss.to(acc).contiguous(), d = denom.to(acc).contiguous();
  const int64_t N = boxes.size(0), B = pred.size(0), M = pred.size(1);
  // Rows no box names stay zero: one fill (a memset), then the boxes' rows.
  at::Tensor grad = at::zeros(pred.sizes(),
                              pred.options().memory_format(at::MemoryFormat::Contiguous));
  if (N == 0) return grad;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const PackedStrides s = packed_strides(pred, boxes, index);
  PACKED_DISPATCH(pred, boxes, index, "packed_loss_backward_cuda", [&] {
    packed_bwd_kernel<pred_t, target_t, index_t, acc_t><<<blocks_for(N), kThreads, 0, stream>>>(
        g.data_ptr<acc_t>(), d.data_ptr<acc_t>(), pred.data_ptr<pred_t>(),
        boxes.data_ptr<target_t>(), index.data_ptr<index_t>(), grad.data_ptr<pred_t>(), N, B,
        M, s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(giou_cuda, m) {
  m.def("packed_loss(Tensor pred, Tensor boxes, Tensor index) -> (Tensor, Tensor)");
  m.def("packed_loss_backward(Tensor grad_loss, Tensor denom, Tensor pred, Tensor boxes, "
        "Tensor index) -> Tensor");
}

TORCH_LIBRARY_IMPL(giou_cuda, CUDA, m) {
  m.impl("packed_loss", &packed_loss_cuda);
  m.impl("packed_loss_backward", &packed_loss_backward_cuda);
}
