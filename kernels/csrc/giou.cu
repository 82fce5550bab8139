// Fused GIoU loss in CUDA C++: forward (per-block partial sums + one finalize block) and
// backward, for the padded batch with per-sample counts. The maths, the gradient and the
// byte ledger are those of kernels/triton_giou.py (see its docstrings); this file mirrors
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

#include <cmath>
#include <string>

namespace {

constexpr float kEps = 1e-7f;
constexpr int kFinalizeThreads = 1024;

// Threads (= slots) per block: the conditional variant's blocks past a sample's count are
// whole and skipped. 128, as the Triton variant's shape measured best (kernels/
// triton_giou.py BLOCK_SLOTS; one-warp blocks of 32 were 2-3x slower than `kernel`).
inline int block_slots(bool conditional) { return conditional ? 128 : 256; }

// d max(a, b) / da with PyTorch's tie rule: half the gradient to each side of a tie.
template <typename T>
__device__ __forceinline__ T d_max(T a, T b) {
  return a > b ? T(1) : (a == b ? T(0.5) : T(0));
}

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

struct Strides {
  int64_t pb, pm, pc, tb, tm, tc;
};

template <typename acc_t>
struct Boxes {
  acc_t px1, py1, px2, py2, gx1, gy1, gx2, gy2;
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

template <typename acc_t>
__device__ __forceinline__ acc_t giou_term(const Boxes<acc_t>& x) {
  const acc_t eps = static_cast<acc_t>(kEps);
  acc_t iw = fmax(fmin(x.px2, x.gx2) - fmax(x.px1, x.gx1), acc_t(0));
  acc_t ih = fmax(fmin(x.py2, x.gy2) - fmax(x.py1, x.gy1), acc_t(0));
  acc_t inter = iw * ih;
  acc_t uni = (x.px2 - x.px1) * (x.py2 - x.py1) + (x.gx2 - x.gx1) * (x.gy2 - x.gy1) - inter;
  acc_t hull = (fmax(x.px2, x.gx2) - fmin(x.px1, x.gx1)) * (fmax(x.py2, x.gy2) - fmin(x.py1, x.gy1));
  return acc_t(1) - inter / (uni + eps) + (hull - uni) / (hull + eps);
}

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block; the result is valid in thread 0.
template <typename acc_t>
__device__ acc_t block_sum(acc_t v) {
  __shared__ acc_t warp_totals[32];
  v = warp_sum(v);
  if (blockDim.x <= 32) return v;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  v = threadIdx.x < warps ? warp_totals[threadIdx.x] : acc_t(0);
  return warp == 0 ? warp_sum(v) : acc_t(0);
}

// Grid (B, cdiv(M, blockDim.x)); one thread per slot. partial[b * gridDim.y + blk].
template <typename scalar_t, typename target_t, typename acc_t>
__global__ void giou_fwd_kernel(const scalar_t* __restrict__ pred,
                                const target_t* __restrict__ target, const void* counts,
                                bool counts64, acc_t* __restrict__ partial, int64_t M,
                                Strides s, bool conditional) {
  const int64_t b = blockIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x;
  const SampleCount count = sample_count(counts, counts64, b, M);
  const int64_t n = count.n;
  const bool bad = count.bad;
  acc_t* out = partial + b * gridDim.y + blockIdx.y;
  if (conditional && first >= n) {  // a whole block of empty slots: no load, no maths
    if (threadIdx.x == 0) *out = bad ? acc_t(NAN) : acc_t(0);
    return;
  }
  const int64_t slot = first + threadIdx.x;
  acc_t term = 0;
  // The kernel variant computes every slot in range and zeroes the invalid ones after.
  if (conditional ? slot < n : slot < M) {
    term = giou_term(load_boxes<scalar_t, target_t, acc_t>(pred, target, b, slot, s));
    if (slot >= n) term = 0;
  }
  const acc_t total = block_sum(term);
  if (threadIdx.x == 0) *out = bad ? acc_t(NAN) : total;
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

// Gradient of the loss w.r.t. the predictions; the maths is in triton_giou.py's
// _giou_bwd_kernel docstring. Conditional blocks past the count write zeros only.
template <typename scalar_t, typename target_t, typename acc_t>
__global__ void giou_bwd_kernel(const acc_t* __restrict__ grad_loss,
                                const acc_t* __restrict__ denom,
                                const scalar_t* __restrict__ pred,
                                const target_t* __restrict__ target, const void* counts,
                                bool counts64, scalar_t* __restrict__ grad, int64_t M,
                                Strides s, bool conditional) {
  const int64_t b = blockIdx.x;
  const int64_t slot = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (slot >= M) return;
  const SampleCount count = sample_count(counts, counts64, b, M);
  const int64_t n = count.n;
  const bool bad = count.bad;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x;
  acc_t g[4] = {0, 0, 0, 0};
  const bool active = conditional ? first < n : true;
  if (active && slot < n) {
    const auto x = load_boxes<scalar_t, target_t, acc_t>(pred, target, b, slot, s);
    const acc_t eps = static_cast<acc_t>(kEps);
    const acc_t scale = -(*grad_loss) / (*denom);  // dLoss = -dGIoU * grad / denom
    const acc_t wp = x.px2 - x.px1, hp = x.py2 - x.py1;
    const acc_t iw_raw = fmin(x.px2, x.gx2) - fmax(x.px1, x.gx1);
    const acc_t ih_raw = fmin(x.py2, x.gy2) - fmax(x.py1, x.gy1);
    const acc_t iw = fmax(iw_raw, acc_t(0)), ih = fmax(ih_raw, acc_t(0));
    const acc_t inter = iw * ih;
    const acc_t uni = wp * hp + (x.gx2 - x.gx1) * (x.gy2 - x.gy1) - inter;
    const acc_t cw = fmax(x.px2, x.gx2) - fmin(x.px1, x.gx1);
    const acc_t ch = fmax(x.py2, x.gy2) - fmin(x.py1, x.gy1);
    const acc_t a = acc_t(1) / (uni + eps), c = acc_t(1) / (cw * ch + eps);
    const acc_t gu = c - inter * a * a, gi = a - gu, gc = -(uni + eps) * c * c;
    const acc_t mw = iw_raw >= 0 ? acc_t(1) : acc_t(0), mh = ih_raw >= 0 ? acc_t(1) : acc_t(0);
    g[0] = scale * (-gu * hp - gi * ih * mw * d_max(x.px1, x.gx1) - gc * ch * d_max(x.gx1, x.px1));
    g[1] = scale * (-gu * wp - gi * iw * mh * d_max(x.py1, x.gy1) - gc * cw * d_max(x.gy1, x.py1));
    g[2] = scale * (gu * hp + gi * ih * mw * d_max(x.gx2, x.px2) + gc * ch * d_max(x.px2, x.gx2));
    g[3] = scale * (gu * wp + gi * iw * mh * d_max(x.gy2, x.py2) + gc * cw * d_max(x.py2, x.gy2));
  }
  scalar_t* out = grad + (b * M + slot) * 4;
  for (int k = 0; k < 4; ++k) out[k] = static_cast<scalar_t>(bad ? acc_t(NAN) : g[k]);
}

// Numbers in the check messages below are text made here (std::to_string), never
// streamed: with torch 2.11 on the H100 machine, every check whose message streamed an
// integer (tensor.sizes() or a size) crashed the process (SIGSEGV) instead of raising,
// while those streaming only text, a dtype or a device raised (RESULTS.md section 6).
std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(t.size(d));
  }
  return s + "]";
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

at::ScalarType acc_type_of(const at::Tensor& pred) {
  return pred.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Dispatch over the prediction dtype (fp16, bf16, fp32, fp64) and then the target's.
#define GIOU_DISPATCH(PRED, TARGET, NAME, ...)                                            \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, PRED.scalar_type(), NAME, [&] { \
    using pred_t = scalar_t;                                                               \
    using acc_t = at::acc_type<pred_t, /*is_cuda=*/true>;                                  \
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, TARGET.scalar_type(), NAME,       \
                               [&] { using target_t = scalar_t; __VA_ARGS__(); });         \
  })

std::tuple<at::Tensor, at::Tensor> giou_loss_cuda(const at::Tensor& pred,
                                                  const at::Tensor& target,
                                                  const at::Tensor& counts, bool conditional) {
  check_inputs(pred, target, counts);
  const c10::cuda::CUDAGuard guard(pred.device());
  const int64_t B = pred.size(0), M = pred.size(1);
  const int threads = block_slots(conditional);
  const int64_t blocks_per_sample = std::max<int64_t>((M + threads - 1) / threads, 1);
  TORCH_CHECK(blocks_per_sample <= 65535,
              "giou_cuda: too many slots per sample: ", std::to_string(M));
  const auto opts = pred.options().dtype(acc_type_of(pred));
  at::Tensor partial = at::empty({B * blocks_per_sample}, opts);
  at::Tensor loss = at::empty({}, opts), denom = at::empty({}, opts);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const Strides s = strides_of(pred, target);
  const bool counts64 = counts.scalar_type() == at::kLong;
  GIOU_DISPATCH(pred, target, "giou_loss_cuda", [&] {
    if (B > 0) {
      giou_fwd_kernel<pred_t, target_t, acc_t>
          <<<dim3(B, blocks_per_sample), threads, 0, stream>>>(
              pred.data_ptr<pred_t>(), target.data_ptr<target_t>(), counts.data_ptr(),
              counts64, partial.data_ptr<acc_t>(), M, s, conditional);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  const int threads = block_slots(conditional);
  const int64_t blocks_per_sample = (M + threads - 1) / threads;
  at::Tensor grad = at::empty(pred.sizes(), pred.options().memory_format(at::MemoryFormat::Contiguous));
  if (B == 0 || M == 0) return grad;
  TORCH_CHECK(blocks_per_sample <= 65535,
              "giou_cuda: too many slots per sample: ", std::to_string(M));
  auto stream = c10::cuda::getCurrentCUDAStream();
  const Strides s = strides_of(pred, target);
  const bool counts64 = counts.scalar_type() == at::kLong;
  GIOU_DISPATCH(pred, target, "giou_loss_backward_cuda", [&] {
    giou_bwd_kernel<pred_t, target_t, acc_t>
        <<<dim3(B, blocks_per_sample), threads, 0, stream>>>(
            g.data_ptr<acc_t>(), d.data_ptr<acc_t>(), pred.data_ptr<pred_t>(),
            target.data_ptr<target_t>(), counts.data_ptr(), counts64,
            grad.data_ptr<pred_t>(), M, s, conditional);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
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
