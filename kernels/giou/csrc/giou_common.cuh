// What the CUDA GIoU kernels share (giou.cu: the padded layout; packed.cu: the packed one):
// the formula's constant, the tie rule, one slot's term and gradient, block sums, a
// gradient row's vector store, the dtype dispatch and the shape text of check messages.
// The maths and the byte ledgers are in kernels/giou/triton_padded.py's docstrings.
#pragma once

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>

#include <cmath>
#include <string>

namespace {

constexpr float kEps = 1e-7f;

// d max(a, b) / da with PyTorch's tie rule: half the gradient to each side of a tie.
template <typename T>
__device__ __forceinline__ T d_max(T a, T b) {
  return a > b ? T(1) : (a == b ? T(0.5) : T(0));
}

template <typename acc_t>
struct Boxes {
  acc_t px1, py1, px2, py2, gx1, gy1, gx2, gy2;
};

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

// One gradient row (4 values) as one 8- or 16-byte store (two for fp64) rather than four
// scalar ones: in Triton the scalar stores ran the zero rows at half a memset's speed
// (results/sweep.md). __stwb is a plain write-back store that is always one vector
// instruction; here nvcc split a vector assignment (or a memcpy) into 4-byte stores. The
// gradient is ours (at::empty, contiguous, blocks aligned to 512 bytes), so each row is
// aligned to its own size.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void store_row(scalar_t* out, const acc_t (&g)[4]) {
  if constexpr (sizeof(scalar_t) == 2) {  // fp16, bf16: their bits packed into one uint2
    const auto bits = [](acc_t v) { return static_cast<uint32_t>(static_cast<scalar_t>(v).x); };
    __stwb(reinterpret_cast<uint2*>(out),
           make_uint2(bits(g[0]) | bits(g[1]) << 16, bits(g[2]) | bits(g[3]) << 16));
  } else if constexpr (sizeof(scalar_t) == 4) {
    __stwb(reinterpret_cast<float4*>(out), make_float4(g[0], g[1], g[2], g[3]));
  } else {
    __stwb(reinterpret_cast<double2*>(out), make_double2(g[0], g[1]));
    __stwb(reinterpret_cast<double2*>(out) + 1, make_double2(g[2], g[3]));
  }
}

// dLoss/dp of one valid slot; the maths is in triton_giou.py's _giou_bwd_kernel docstring.
template <typename acc_t>
__device__ __forceinline__ void slot_gradient(const Boxes<acc_t>& x, acc_t scale, acc_t (&g)[4]) {
  const acc_t eps = static_cast<acc_t>(kEps);
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

// Numbers in the check messages below are text made here (std::to_string), never
// streamed: with torch 2.11 on the H100 machine, every check whose message streamed an
// integer (tensor.sizes() or a size) crashed the process (SIGSEGV) instead of raising,
// while those streaming only text, a dtype or a device raised (results/correctness.md).
std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(t.size(d));
  }
  return s + "]";
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

}  // namespace
