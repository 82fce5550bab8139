// Fused GIoU loss over the packed layout in CUDA C++, the twin of kernels/giou/triton_packed.py
// (its docstring has the layout, the contract and the byte ledger): the batch's N boxes
// [N, 4] with index [2, N] (each box's image, then its slot) and offsets [B + 1],
// predictions [B, M, 4].
//
// Ops: giou_cuda::packed_loss -> (loss, denom): one block per kThreads boxes writes two
// partials (the terms' sum and how many of its boxes were out of range), then one block
// sums them and checks the offsets; giou_cuda::packed_loss_backward -> grad: one launch,
// grid (B, chunks of 1024 slots) as giou.cu's conditional variant, each block walking its
// image's slots below the count, then zero rows. Every launch goes on the current stream,
// then a launch check.
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

// One block: loss = sum / denom, denom = max(N, 1), or NaN if a box was out of range or
// the offsets do not partition the N boxes into counts within [0, M] (the backward then
// makes every box's gradient NaN). A fixed order: deterministic.
template <typename offset_t, typename acc_t>
__global__ void packed_finalize_kernel(const acc_t* __restrict__ partial, int64_t P,
                                       const offset_t* __restrict__ offsets, int64_t N,
                                       int64_t B, int64_t M, acc_t* __restrict__ loss,
                                       acc_t* __restrict__ denom) {
  acc_t sum = 0, bad = 0;
  for (int64_t k = threadIdx.x; k < P; k += blockDim.x) {
    sum += partial[k];
    bad += partial[P + k];
  }
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) {
    const int64_t count = static_cast<int64_t>(offsets[b + 1]) - offsets[b];
    bad += (count < 0 || count > M) ? acc_t(1) : acc_t(0);
  }
  if (threadIdx.x == 0 && (offsets[0] != 0 || offsets[B] != N)) bad += 1;
  sum = block_sum(sum);
  __syncthreads();
  bad = block_sum(bad);
  if (threadIdx.x == 0) {
    const acc_t d = bad > 0 ? acc_t(NAN) : static_cast<acc_t>(N > 1 ? N : 1);
    *loss = sum / d;
    *denom = d;
  }
}

// The backward's shape: giou.cu's conditional variant (Shape<true>): a block owns 1024
// slots of one image and walks them 128 at a time.
constexpr int kBwdChunk = 1024, kBwdThreads = 128;

// grad[b, slot] for slot below image b's count, against box offsets[b] + slot; 0 for the
// rest of the chunk; NaN in every row of an image whose offsets are out of range (its
// boxes are then not read). Grid (B, cdiv(M, kBwdChunk)).
template <typename scalar_t, typename target_t, typename offset_t, typename acc_t>
__global__ void __launch_bounds__(kBwdThreads)
    packed_bwd_kernel(const acc_t* __restrict__ grad_loss, const acc_t* __restrict__ denom,
                      const scalar_t* __restrict__ pred, const target_t* __restrict__ boxes,
                      const offset_t* __restrict__ offsets, scalar_t* __restrict__ grad,
                      int64_t N, int64_t M, PackedStrides s) {
  const int64_t b = blockIdx.x;
  const int64_t first = offsets[b], end = offsets[b + 1];
  const bool bad = end - first < 0 || end - first > M || first < 0 || end > N;
  const int64_t n = bad ? 0 : end - first;
  const int64_t lo = static_cast<int64_t>(blockIdx.y) * kBwdChunk;
  const int64_t hi = lo + kBwdChunk < M ? lo + kBwdChunk : M;
  const int64_t work_hi = n < lo ? lo : (n < hi ? n : hi);
  const acc_t poison = bad ? acc_t(NAN) : acc_t(0);
  const acc_t scale = -(*grad_loss) / (*denom);
  scalar_t* rows = grad + b * M * 4;
#pragma unroll 1
  for (int64_t slot = lo + threadIdx.x; slot < work_hi; slot += blockDim.x) {
    acc_t g[4];
    slot_gradient(load_box<scalar_t, target_t, acc_t>(pred, boxes, first + slot, b, slot, s),
                  scale, g);
    store_row(rows + slot * 4, g);
  }
  const acc_t zero[4] = {poison, poison, poison, poison};
#pragma unroll 1
  for (int64_t slot = work_hi + threadIdx.x; slot < hi; slot += blockDim.x)
    store_row(rows + slot * 4, zero);
}

void check_packed_inputs(const at::Tensor& pred, const at::Tensor& boxes,
                         const at::Tensor& index, const at::Tensor& offsets) {
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
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == pred.size(0) + 1,
              "giou_cuda: offsets must be [", std::to_string(pred.size(0) + 1), "], got ",
              shape_of(offsets));
  TORCH_CHECK(offsets.scalar_type() == at::kInt || offsets.scalar_type() == at::kLong,
              "giou_cuda: offsets must be int32 or int64, got ", offsets.scalar_type());
  TORCH_CHECK(offsets.is_contiguous(), "giou_cuda: offsets must be contiguous");
  TORCH_CHECK(boxes.device() == pred.device() && index.device() == pred.device() &&
                  offsets.device() == pred.device(),
              "giou_cuda: predictions, targets, index and offsets must be on one device, got ",
              pred.device(), ", ", boxes.device(), ", ", index.device(), " and ",
              offsets.device());
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

// Calls launch with the offsets' element type (int32 or int64).
template <typename Launch>
void with_offsets(const at::Tensor& offsets, Launch&& launch) {
  if (offsets.scalar_type() == at::kLong) {
    launch(int64_t{});
  } else {
    launch(int32_t{});
  }
}

std::tuple<at::Tensor, at::Tensor> packed_loss_cuda(const at::Tensor& pred,
                                                    const at::Tensor& boxes,
                                                    const at::Tensor& index,
                                                    const at::Tensor& offsets) {
  check_packed_inputs(pred, boxes, index, offsets);
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
    with_offsets(offsets, [&](auto offset) {
      using offset_t = decltype(offset);
      packed_finalize_kernel<offset_t, acc_t><<<1, kFinalizeThreads, 0, stream>>>(
          partial.data_ptr<acc_t>(), P, offsets.data_ptr<offset_t>(), N, B, M,
          loss.data_ptr<acc_t>(), denom.data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {loss, denom};
}

at::Tensor packed_loss_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& denom,
                                     const at::Tensor& pred, const at::Tensor& boxes,
                                     const at::Tensor& offsets) {
  TORCH_CHECK(pred.is_cuda() && pred.dim() == 3 && pred.size(2) == 4 && boxes.dim() == 2 &&
                  boxes.size(1) == 4 && offsets.dim() == 1 &&
                  offsets.size(0) == pred.size(0) + 1 && offsets.is_contiguous() &&
                  (offsets.scalar_type() == at::kInt || offsets.scalar_type() == at::kLong),
              "giou_cuda: packed_loss_backward takes CUDA predictions [B, M, 4], boxes "
              "[N, 4] and contiguous int32 or int64 offsets [B + 1]");
  TORCH_CHECK(grad_loss.numel() == 1 && denom.numel() == 1,
              "giou_cuda: grad and denom must be scalars");
  TORCH_CHECK(grad_loss.device() == pred.device() && denom.device() == pred.device() &&
                  boxes.device() == pred.device() && offsets.device() == pred.device(),
              "giou_cuda: every input must be on the predictions' device");
  const c10::cuda::CUDAGuard guard(pred.device());
  const auto acc = acc_type_of(pred);
  const at::Tensor g = grad_loss.to(acc).contiguous(), d = denom.to(acc).contiguous();
  const int64_t N = boxes.size(0), B = pred.size(0), M = pred.size(1);
  at::Tensor grad = at::empty(pred.sizes(),
                              pred.options().memory_format(at::MemoryFormat::Contiguous));
  if (B == 0 || M == 0) return grad;
  const int64_t chunks = (M + kBwdChunk - 1) / kBwdChunk;
  TORCH_CHECK(chunks <= 65535, "giou_cuda: too many slots per sample: ", std::to_string(M));
  auto stream = c10::cuda::getCurrentCUDAStream();
  const PackedStrides s = {pred.stride(0), pred.stride(1), pred.stride(2), boxes.stride(0),
                           boxes.stride(1), 0, 0};
  GIOU_DISPATCH(pred, boxes, "packed_loss_backward_cuda", [&] {
    with_offsets(offsets, [&](auto offset) {
      using offset_t = decltype(offset);
      packed_bwd_kernel<pred_t, target_t, offset_t, acc_t>
          <<<dim3(B, chunks), kBwdThreads, 0, stream>>>(
              g.data_ptr<acc_t>(), d.data_ptr<acc_t>(), pred.data_ptr<pred_t>(),
              boxes.data_ptr<target_t>(), offsets.data_ptr<offset_t>(),
              grad.data_ptr<pred_t>(), N, M, s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(giou_cuda, m) {
  m.def("packed_loss(Tensor pred, Tensor boxes, Tensor index, Tensor offsets) -> "
        "(Tensor, Tensor)");
  m.def("packed_loss_backward(Tensor grad_loss, Tensor denom, Tensor pred, Tensor boxes, "
        "Tensor offsets) -> Tensor");
}

TORCH_LIBRARY_IMPL(giou_cuda, CUDA, m) {
  m.impl("packed_loss", &packed_loss_cuda);
  m.impl("packed_loss_backward", &packed_loss_backward_cuda);
}
