// Fused GIoU loss in CUDA C++: forward (per-chunk partial sums + one finalize block) and
// backward, for the padded batch with per-sample counts. The maths, the gradient and the
// byte ledger are those of kernels/giou/triton_padded.py (see its docstrings); this file mirrors
// that design so the two backends can be compared launch for launch.
//
// Ops (schema below): giou_cuda::loss -> (loss, denom), giou_cuda::loss_backward -> grad.
// Every launch goes on the current stream and is followed by a launch check.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "giou_common.cuh"

#include <cmath>
#include <string>
#include <type_traits>

namespace {

constexpr int kFinalizeThreads = 1024;

// Per variant: the slots a block owns (kChunk) and its threads (kThreads); a block walks
// its chunk kThreads slots at a time. `kernel`: one slot a thread, 256-slot blocks (its
// shape since it was written). `conditional`: the Triton variant's shape
// (kernels/giou/triton_padded.py SHAPES[True]): 1024 slots, 128 at a time, so a sparse sample
// costs one block per 1024 slots, not per 128. Its blocks walk only the slots below the
// count; the backward then writes the rest of its chunk as whole zero rows.
template <bool kConditional>
struct Shape;
template <>
struct Shape<false> {
  static constexpr int kChunk = 256, kThreads = 256;
};
template <>
struct Shape<true> {
  static constexpr int kChunk = 1024, kThreads = 128;
};
// gridDim.y holds a sample's chunks.
constexpr int64_t kMaxChunks = 65535;

__device__ __forceinline__ int64_t load_count(const void* counts, bool counts64, int64_t b) {
  return counts64 ? static_cast<const int64_t*>(counts)[b]
                  : static_cast<const int32_t*>(counts)[b];
}

// A sample's count clamped to [0, M], and whether it was outside (the sample's loss and
// gradients are then NaN: a bad count is never read out of bounds, never a silent answer).
struct SampleCount {
  int64_t n;
  bool bad;
};

__device__ __forceinline__ SampleCount sample_count(const void* counts, bool counts64,
                                                    int64_t b, int64_t M) {
  const int64_t raw = load_count(counts, counts64, b);
  return {raw < 0 ? 0 : (raw > M ? M : raw), raw < 0 || raw > M};
}

// This block's slots [lo, hi) and the end of those it loads and computes (work_hi: hi for
// `kernel`, the sample's count within the chunk for `conditional`).
struct ChunkLimits {
  int64_t lo, hi, work_hi;
};

template <bool kConditional>
__device__ __forceinline__ ChunkLimits chunk_limits(int64_t n, int64_t M) {
  const int64_t lo = static_cast<int64_t>(blockIdx.y) * Shape<kConditional>::kChunk;
  const int64_t hi = lo + Shape<kConditional>::kChunk < M ? lo + Shape<kConditional>::kChunk : M;
  const int64_t work_hi = kConditional ? (n < lo ? lo : (n < hi ? n : hi)) : hi;
  return {lo, hi, work_hi};
}

struct Strides {
  int64_t pb, pm, pc, tb, tm, tc;
};

template <typename scalar_t, typename target_t, typename acc_t>
__device__ __forceinline__ Boxes<acc_t> load_boxes(const scalar_t* pred, const target_t* target,
                                                   int64_t b, int64_t slot, const Strides& s) {
  const scalar_t* p = pred + b * s.pb + slot * s.pm;
  const target_t* t = target + b * s.tb + slot * s.tm;
  return {static_cast<acc_t>(p[0]), static_cast<acc_t>(p[s.pc]),
          static_cast<acc_t>(p[2 * s.pc]), static_cast<acc_t>(p[3 * s.pc]),
          static_cast<acc_t>(t[0]), static_cast<acc_t>(t[s.tc]),
          static_cast<acc_t>(t[2 * s.tc]), static_cast<acc_t>(t[3 * s.tc])};
}

// Grid (B, cdiv(M, kChunk)); partial[b * gridDim.y + chunk] is the sum over the chunk's
// valid slots of 1 - GIoU (NaN on a bad count).
template <bool kConditional, typename scalar_t, typename target_t, typename acc_t>
__global__ void __launch_bounds__(Shape<kConditional>::kThreads)
    giou_fwd_kernel(const scalar_t* __restrict__ pred, const target_t* __restrict__ target,
                    const void* counts, bool counts64, acc_t* __restrict__ partial, int64_t M,
                    Strides s) {
  const int64_t b = blockIdx.x;
  const SampleCount count = sample_count(counts, counts64, b, M);
  const ChunkLimits c = chunk_limits<kConditional>(count.n, M);
  acc_t* out = partial + b * gridDim.y + blockIdx.y;
  if (c.work_hi == c.lo) {  // the whole chunk is past the count: no load, no maths (the
    // test is uniform over the block, so no thread waits in block_sum below)
    if (threadIdx.x == 0) *out = count.bad ? acc_t(NAN) : acc_t(0);
    return;
  }
  acc_t terms = 0;
  // The kernel variant computes every slot of its chunk and drops the invalid ones.
#pragma unroll 1
  for (int64_t slot = c.lo + threadIdx.x; slot < c.work_hi; slot += blockDim.x) {
    const acc_t term = giou_term(load_boxes<scalar_t, target_t, acc_t>(pred, target, b, slot, s));
    if (slot < count.n) terms += term;
  }
  const acc_t total = block_sum(terms);
  if (threadIdx.x == 0) *out = count.bad ? acc_t(NAN) : total;
}

// One block: loss = sum(partials) / max(sum(counts), 1), in a fixed order (deterministic).
template <typename acc_t>
__global__ void giou_finalize_kernel(const acc_t* __restrict__ partial, int64_t P,
                                     const void* counts, bool counts64, int64_t B,
                                     acc_t* __restrict__ loss, acc_t* __restrict__ denom) {
  acc_t sum = 0;
  for (int64_t i = threadIdx.x; i < P; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum);
  __syncthreads();  // block_sum's shared buffer is reused below
  long long boxes = 0;  // summed as integers: exact for any batch
  for (int64_t i = threadIdx.x; i < B; i += blockDim.x) boxes += load_count(counts, counts64, i);
  boxes = block_sum(boxes);
  if (threadIdx.x == 0) {
    const acc_t d = static_cast<acc_t>(boxes > 1 ? boxes : 1);
    *loss = sum / d;
    *denom = d;
  }
}

// Gradient of the loss w.r.t. the predictions, grid as the forward's. Both variants load
// only the valid slots: `kernel`'s threads past the count skip their loads, as they have
// since it was written (the Triton `kernel` loads every slot). `conditional` then writes
// the rest of its chunk as zero rows in a loop of its own: plain stores, no loads, no
// maths.
template <bool kConditional, typename scalar_t, typename target_t, typename acc_t>
__global__ void __launch_bounds__(Shape<kConditional>::kThreads)
    giou_bwd_kernel(const acc_t* __restrict__ grad_loss, const acc_t* __restrict__ denom,
                    const scalar_t* __restrict__ pred, const target_t* __restrict__ target,
                    const void* counts, bool counts64, scalar_t* __restrict__ grad, int64_t M,
                    Strides s) {
  const int64_t b = blockIdx.x;
  const SampleCount count = sample_count(counts, counts64, b, M);
  const ChunkLimits c = chunk_limits<kConditional>(count.n, M);
  scalar_t* rows = grad + b * M * 4;
  // A bad count poisons the sample's gradient; valid or not, a slot past the count gets
  // exactly 0 by selection (a NaN in padding times 0 would still be NaN).
  const acc_t poison = count.bad ? acc_t(NAN) : acc_t(0);
  const acc_t scale = -(*grad_loss) / (*denom);  // dLoss = -dGIoU * grad / denom
#pragma unroll 1
  for (int64_t slot = c.lo + threadIdx.x; slot < c.work_hi; slot += blockDim.x) {
    acc_t g[4] = {poison, poison, poison, poison};
    if (slot < count.n) {
      slot_gradient(load_boxes<scalar_t, target_t, acc_t>(pred, target, b, slot, s), scale, g);
      for (int k = 0; k < 4; ++k) g[k] += poison;
    }
    store_row(rows + slot * 4, g);
  }
  const acc_t zero[4] = {poison, poison, poison, poison};
#pragma unroll 1
  for (int64_t slot = c.work_hi + threadIdx.x; slot < c.hi; slot += blockDim.x)
    store_row(rows + slot * 4, zero);
}

void check_inputs(const at::Tensor& pred, const at::Tensor& target, const at::Tensor& counts) {
  TORCH_CHECK(pred.is_cuda(), "giou_cuda: predictions must be a CUDA tensor, got ",
              pred.device(), " (the CUDA backend needs a CUDA GPU)");
  TORCH_CHECK(pred.dim() == 3 && pred.size(2) == 4,
              "giou_cuda: predictions must be [batch, slots, 4], got ", shape_of(pred));
  TORCH_CHECK(target.dim() == 3 && target.size(0) == pred.size(0) &&
                  target.size(1) == pred.size(1) && target.size(2) == 4,
              "giou_cuda: targets ", shape_of(target), " must have the predictions' shape ",
              shape_of(pred));
  TORCH_CHECK(counts.dim() == 1 && counts.size(0) == pred.size(0),
              "giou_cuda: counts must be [", std::to_string(pred.size(0)), "], got ",
              shape_of(counts));
  TORCH_CHECK(counts.scalar_type() == at::kInt || counts.scalar_type() == at::kLong,
              "giou_cuda: counts must be int32 or int64, got ", counts.scalar_type());
  TORCH_CHECK(target.device() == pred.device() && counts.device() == pred.device(),
              "giou_cuda: predictions, targets and counts must be on one device, got ",
              pred.device(), ", ", target.device(), " and ", counts.device());
  TORCH_CHECK(counts.is_contiguous(), "giou_cuda: counts must be contiguous");
}

Strides strides_of(const at::Tensor& pred, const at::Tensor& target) {
  return {pred.stride(0), pred.stride(1), pred.stride(2),
          target.stride(0), target.stride(1), target.stride(2)};
}

// A sample's chunks (the grid's second dimension) in the variant's shape.
int64_t chunks_per_sample(int64_t M, bool conditional) {
  const int64_t chunk = conditional ? Shape<true>::kChunk : Shape<false>::kChunk;
  const int64_t chunks = std::max<int64_t>((M + chunk - 1) / chunk, 1);
  TORCH_CHECK(chunks <= kMaxChunks, "giou_cuda: too many slots per sample: ", std::to_string(M),
              " (the ", conditional ? "conditional" : "kernel", " variant takes at most ",
              std::to_string(kMaxChunks * chunk), ")");
  return chunks;
}

// Calls launch(std::integral_constant<bool, conditional>): the variant is a compile-time
// parameter of the kernels, so each variant's code is built for its own shape (a first
// port with a runtime flag slowed `kernel` 1.4-1.5x, not all of it explained:
// results/sweep.md).
template <typename Launch>
void with_variant(bool conditional, Launch&& launch) {
  if (conditional) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
}

std::tuple<at::Tensor, at::Tensor> giou_loss_cuda(const at::Tensor& pred,
                                                  const at::Tensor& target,
                                                  const at::Tensor& counts, bool conditional) {
  check_inputs(pred, target, counts);
  const c10::cuda::CUDAGuard guard(pred.device());
  const int64_t B = pred.size(0), M = pred.size(1);
  const int64_t chunks = chunks_per_sample(M, conditional);
  const auto opts = pred.options().dtype(acc_type_of(pred));
  at::Tensor partial = at::empty({B * chunks}, opts);
  at::Tensor loss = at::empty({}, opts), denom = at::empty({}, opts);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const Strides s = strides_of(pred, target);
  const bool counts64 = counts.scalar_type() == at::kLong;
  GIOU_DISPATCH(pred, target, "giou_loss_cuda", [&] {
    if (B > 0) {
      with_variant(conditional, [&](auto variant) {
        constexpr bool kConditional = decltype(variant)::value;
        giou_fwd_kernel<kConditional, pred_t, target_t, acc_t>
            <<<dim3(B, chunks), Shape<kConditional>::kThreads, 0, stream>>>(
                pred.data_ptr<pred_t>(), target.data_ptr<target_t>(), counts.data_ptr(),
                counts64, partial.data_ptr<acc_t>(), M, s);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    }
    giou_finalize_kernel<acc_t><<<1, kFinalizeThreads, 0, stream>>>(
        partial.data_ptr<acc_t>(), partial.numel(), counts.data_ptr(), counts64, B,
        loss.data_ptr<acc_t>(), denom.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {loss, denom};
}

at::Tensor giou_loss_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& denom,
                                   const at::Tensor& pred, const at::Tensor& target,
                                   const at::Tensor& counts, bool conditional) {
  check_inputs(pred, target, counts);
  const auto acc = acc_type_of(pred);
  TORCH_CHECK(grad_loss.numel() == 1 && denom.numel() == 1, "giou_cuda: grad and denom must be scalars");
  TORCH_CHECK(grad_loss.device() == pred.device() && denom.device() == pred.device(),
              "giou_cuda: grad and denom must be on the predictions' device");
  const c10::cuda::CUDAGuard guard(pred.device());
  // The upstream gradient usually arrives in acc dtype already; .to() is then a no-op.
  const at::Tensor g = grad_loss.to(acc).contiguous(), d = denom.to(acc).contiguous();
  const int64_t B = pred.size(0), M = pred.size(1);
  at::Tensor grad = at::empty(pred.sizes(), pred.options().memory_format(at::MemoryFormat::Contiguous));
  if (B == 0 || M == 0) return grad;
  const int64_t chunks = chunks_per_sample(M, conditional);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const Strides s = strides_of(pred, target);
  const bool counts64 = counts.scalar_type() == at::kLong;
  GIOU_DISPATCH(pred, target, "giou_loss_backward_cuda", [&] {
    with_variant(conditional, [&](auto variant) {
      constexpr bool kConditional = decltype(variant)::value;
      giou_bwd_kernel<kConditional, pred_t, target_t, acc_t>
          <<<dim3(B, chunks), Shape<kConditional>::kThreads, 0, stream>>>(
              g.data_ptr<acc_t>(), d.data_ptr<acc_t>(), pred.data_ptr<pred_t>(),
              target.data_ptr<target_t>(), counts.data_ptr(), counts64,
              grad.data_ptr<pred_t>(), M, s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY(giou_cuda, m) {
  m.def("loss(Tensor pred, Tensor target, Tensor counts, bool conditional) -> (Tensor, Tensor)");
  m.def("loss_backward(Tensor grad_loss, Tensor denom, Tensor pred, Tensor target, "
        "Tensor counts, bool conditional) -> Tensor");
}

TORCH_LIBRARY_IMPL(giou_cuda, CUDA, m) {
  m.impl("loss", &giou_loss_cuda);
  m.impl("loss_backward", &giou_loss_backward_cuda);
}
