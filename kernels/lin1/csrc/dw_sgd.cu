// lin1's weight-gradient GEMM with the shadow SGD in its epilogue (CUTLASS 3, sm90a).
//
//   dW = dY^T X          M = out features, N = in features, K = the batch
//   g  = float(bf16(dW))                  the bf16 gradient the GEMM would have written
//   buf    = mu * buf + g                 (fp32 momentum, in place)
//   master = master - lr * buf            (fp32 master weights, in place)
//   shadow = bf16(master)                 (the bf16 weight the next forward reads)
//
// Why CUTLASS: the update streams 18 bytes an element (master and momentum read and
// written, the shadow written), 2.5x the time of the dW tile's MMAs on an H100. A
// warp-specialized kernel overlaps them: a producer warp loads A/B tiles by TMA, another
// loads the master and momentum sub-tiles of the epilogue by TMA, while the consumer warp
// groups run the MMAs of one tile and the epilogue of another (the ping-pong schedule).
// The epilogue is an epilogue visitor tree: two aux loads, two aux stores, three FMAs.
//
// No torch here: dw_sgd_binding.cpp checks tensors and calls dw_sgd_launch.

#include <cstdint>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "dw_sgd.h"

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

namespace {

using Bf16 = cutlass::bfloat16_t;
constexpr auto RNE = cutlass::FloatRoundStyle::round_to_nearest;

// dY is [K, M] row-major: A (M x K) is M-major, a column-major A in CUTLASS's terms.
// X is [K, N] row-major: B (N x K) is N-major, a row-major B. dW, master, momentum and
// the shadow are [M, N] row-major.
using LayoutA = cutlass::layout::ColumnMajor;
using LayoutB = cutlass::layout::RowMajor;
using LayoutD = cutlass::layout::RowMajor;
using StrideAux = cutlass::gemm::TagToStrideC_t<LayoutD>;

// StagesC, StagesD: sub-tiles of master and momentum in flight, loads and stores. Each
// stage costs 2 x 4 x |EpiTile| bytes of shared memory each way, taken from the
// mainloop's stages; CollectiveBuilder would pick them from the number of sub-tiles, so
// the epilogue is put together here as the builder does (sm90_builder.inl), with these.
template <class TileShape, class ClusterShape, class MainloopSchedule, class EpilogueSchedule,
          class EpiTile, int StagesC, int StagesD>
struct DwSgd {
  static constexpr bool kCooperative =
      cute::is_same_v<EpilogueSchedule, cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using Policy = cutlass::epilogue::Sm90TmaWarpSpecialized<
      StagesC, StagesD, size(EpiTile{}) / (kCooperative ? 256 : 128), false, true>;
  using StrideD = cutlass::gemm::TagToStrideC_t<LayoutD>;
  using SmemAtomF32 = decltype(cutlass::epilogue::collective::detail::
                                   sm90_get_epilogue_smem_swizzle_layout_atom<StrideAux, float, EpiTile>());
  using SmemAtomBf16 = decltype(cutlass::epilogue::collective::detail::
                                    sm90_get_epilogue_smem_swizzle_layout_atom<StrideD, Bf16, EpiTile>());

  using AuxLoad = fusion::Sm90AuxLoad<
      StagesC, EpiTile, float, StrideAux, SmemAtomF32,
      decltype(cutlass::epilogue::collective::detail::sm90_get_smem_load_op_for_source<StrideAux, float, EpiTile>())>;
  using AuxStore = fusion::Sm90AuxStore<
      StagesD, EpiTile, float, RNE, StrideAux, SmemAtomF32,
      decltype(cutlass::epilogue::collective::detail::sm90_get_smem_store_op_for_accumulator<StrideAux, float, EpiTile>())>;
  using Scalar = fusion::Sm90ScalarBroadcast<float>;

  // g: the accumulator rounded to bf16, as the GEMM alone would have stored it.
  using Grad = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::epilogue::thread::Identity, Bf16, float, RNE>,
      fusion::Sm90AccFetch>;
  // buf = mu * buf + g, stored.
  using Momentum = fusion::Sm90EVT<AuxStore,
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, RNE>,
                      Scalar, AuxLoad, Grad>>;
  // master = (-lr) * buf + master, stored; D = bf16(master).
  using Master = fusion::Sm90EVT<AuxStore,
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, RNE>,
                      Scalar, Momentum, AuxLoad>>;
  using Update = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::epilogue::thread::Identity, Bf16, float, RNE>, Master>;

  using CopyAtomC = cute::conditional_t<size<1>(EpiTile{}) % 16 == 0,
                                        Copy_Atom<SM90_U32x4_STSM_N, cutlass::half_t>,
                                        Copy_Atom<SM90_U32x2_STSM_N, cutlass::half_t>>;
  using CollectiveEpilogue = cutlass::epilogue::collective::CollectiveEpilogue<
      Policy, TileShape, EpiTile, void, StrideD, Bf16, StrideD, Update,
      SM90_TMA_LOAD, SmemAtomBf16,
      decltype(cutlass::epilogue::collective::detail::sm90_get_smem_load_op_for_source<StrideD, Bf16, EpiTile>()),
      SM90_TMA_STORE, SmemAtomBf16,
      decltype(cutlass::epilogue::collective::detail::sm90_get_smem_store_op_for_accumulator<StrideD, Bf16, EpiTile>()),
      CopyAtomC, void>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA, 8, Bf16, LayoutB, 8,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(DwSgdProblem const& p, int sms) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    auto stride_a = cutlass::make_cute_packed_stride(StrideA{}, make_shape(p.m, p.k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, make_shape(p.n, p.k, 1));
    auto stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(p.m, p.n, 1));
    auto stride_aux = cutlass::make_cute_packed_stride(StrideAux{}, make_shape(p.m, p.n, 1));
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = sms;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, 1},
        {static_cast<Bf16 const*>(p.dy), stride_a, static_cast<Bf16 const*>(p.x), stride_b},
        {{}, nullptr, stride_d, static_cast<Bf16*>(p.shadow), stride_d},
        hw};
    // Each node's arguments: {children..., its own}; see the tree above.
    args.epilogue.thread = {
        {                                   // Master: store
          {                                 //   (-lr) * buf + master
            {{-p.lr}},                      //     -lr
            {                               //     Momentum: store
              {                             //       mu * buf + g
                {{p.momentum}},             //         mu
                {p.buf, 0.f, stride_aux},   //         buf
                {{}, {}},                   //         g = bf16(acc)
                {}},
              {p.buf, stride_aux}},
            {p.master, 0.f, stride_aux},    //     master
            {}},
          {p.master, stride_aux}},
        {}};                                // D = bf16(master)
    return args;
  }
};

// The schedules tried (results/step.md says which was measured how).
using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpiPingPong = cutlass::epilogue::TmaWarpSpecialized;
using EpiCoop = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Tile128 = Shape<_128, _128, _64>;
using Cluster12 = Shape<_1, _2, _1>;
#ifndef DW_SGD_VARIANTS
#define DW_SGD_VARIANTS 0
#endif
#if DW_SGD_VARIANTS == 0
using V0 = DwSgd<Tile128, Shape<_2, _2, _1>, PingPong, EpiPingPong, Shape<_64, _32>, 4, 2>;
using V1 = DwSgd<Tile128, Shape<_2, _1, _1>, PingPong, EpiPingPong, Shape<_64, _32>, 4, 2>;
#else
using V0 = DwSgd<Tile128, Shape<_2, _2, _1>, PingPong, EpiPingPong, Shape<_64, _64>, 2, 1>;
using V1 = DwSgd<Tile128, Shape<_1, _4, _1>, PingPong, EpiPingPong, Shape<_64, _32>, 4, 2>;
#endif

template <class Config>
int run(DwSgdProblem const& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
        size_t* needed) {
  using Gemm = typename Config::Gemm;
  auto args = Config::arguments(p, p.sms);
  size_t bytes = Gemm::get_workspace_size(args);
  if (needed) {
    *needed = bytes;
    return 0;
  }
  if (bytes > workspace_bytes) return DW_SGD_SMALL_WORKSPACE;
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return DW_SGD_CANNOT_IMPLEMENT;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess)
    return DW_SGD_INIT_FAILED;
  return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : DW_SGD_LAUNCH_FAILED;
}

}  // namespace

#if DW_SGD_VARIANTS == 0
int dw_sgd_launch(DwSgdProblem const& p, int variant, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, size_t* workspace_needed) {
  if (variant >= 2) return dw_sgd_launch_more(p, variant - 2, workspace, workspace_bytes, stream, workspace_needed);
  return variant == 0 ? run<V0>(p, workspace, workspace_bytes, stream, workspace_needed)
                      : run<V1>(p, workspace, workspace_bytes, stream, workspace_needed);
}
#else
int dw_sgd_launch_more(DwSgdProblem const& p, int variant, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, size_t* workspace_needed) {
  if (variant >= 2) return DW_SGD_NO_VARIANT;
  return variant == 0 ? run<V0>(p, workspace, workspace_bytes, stream, workspace_needed)
                      : run<V1>(p, workspace, workspace_bytes, stream, workspace_needed);
}
#endif

#ifdef DW_SGD_SIZES
#include <cstdio>
template <class C> void sizes(char const* name) {
  printf("%s: epilogue smem %zu B, mainloop stages %d, kernel smem %zu B\n", name,
         sizeof(typename C::CollectiveEpilogue::SharedStorage),
         int(C::CollectiveMainloop::DispatchPolicy::Stages),
         size_t(C::Kernel::SharedStorageSize));
}
int main() { sizes<V0>("v0"); sizes<V1>("v1"); }
#endif
