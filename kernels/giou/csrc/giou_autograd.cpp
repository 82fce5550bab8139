// Autograd for giou_cuda::loss in C++, registered at the Autograd dispatch key.
//
// Why C++ and not torch.library.register_autograd: a Python autograd registration runs a
// Python autograd.Function on every call, and this op is launch-bound (its kernels take
// 5-10 us of GPU time). Measured on 2 CPU cores (torch 2.13), a trivial custom op costs
// 58 us a call with a Python autograd registration, 24 us without one; the loss range of
// the original's measurement is host time. Here the whole call, from torch.ops to the
// kernel launches, stays in C++. The fake (meta) implementations stay in Python
// (kernels/giou/cuda_extension.py); torch.compile traces through this kernel into them.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<at::Tensor, at::Tensor> call_loss(const at::Tensor& pred, const at::Tensor& target,
                                             const at::Tensor& counts, bool conditional) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("giou_cuda::loss", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>();
  return op.call(pred, target, counts, conditional);
}

at::Tensor call_loss_backward(const at::Tensor& grad_loss, const at::Tensor& denom,
                              const at::Tensor& pred, const at::Tensor& target,
                              const at::Tensor& counts, bool conditional) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("giou_cuda::loss_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, bool)>();
  return op.call(grad_loss, denom, pred, target, counts, conditional);
}

struct GiouLoss : public torch::autograd::Function<GiouLoss> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& pred,
                               const at::Tensor& target, const at::Tensor& counts,
                               bool conditional) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [loss, denom] = call_loss(pred, target, counts, conditional);
    ctx->save_for_backward({pred, target, counts, denom});
    ctx->saved_data["conditional"] = conditional;
    ctx->mark_non_differentiable({denom});
    // No zero gradient (and fill launch) is made for outputs that got none.
    ctx->set_materialize_grads(false);
    return {loss, denom};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad_loss = grads[0];
    if (!grad_loss.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = call_loss_backward(grad_loss, saved[3], saved[0], saved[1], saved[2],
                                         ctx->saved_data["conditional"].toBool());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};  // one per forward input
  }
};

std::tuple<at::Tensor, at::Tensor> loss_autograd(const at::Tensor& pred,
                                                 const at::Tensor& target,
                                                 const at::Tensor& counts, bool conditional) {
  auto out = GiouLoss::apply(pred, target, counts, conditional);
  return {out[0], out[1]};
}

// The packed layout's op (packed.cu): the same pattern, inputs (pred, boxes, index,
// offsets); the backward needs the offsets, not the index.
std::tuple<at::Tensor, at::Tensor> call_packed_loss(const at::Tensor& pred,
                                                    const at::Tensor& boxes,
                                                    const at::Tensor& index,
                                                    const at::Tensor& offsets) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("giou_cuda::packed_loss", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&)>();
  return op.call(pred, boxes, index, offsets);
}

at::Tensor call_packed_loss_backward(const at::Tensor& grad_loss, const at::Tensor& denom,
                                     const at::Tensor& pred, const at::Tensor& boxes,
                                     const at::Tensor& offsets) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("giou_cuda::packed_loss_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&)>();
  return op.call(grad_loss, denom, pred, boxes, offsets);
}

struct PackedGiouLoss : public torch::autograd::Function<PackedGiouLoss> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& pred,
                               const at::Tensor& boxes, const at::Tensor& index,
                               const at::Tensor& offsets) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [loss, denom] = call_packed_loss(pred, boxes, index, offsets);
    ctx->save_for_backward({pred, boxes, offsets, denom});
    ctx->mark_non_differentiable({denom});
    ctx->set_materialize_grads(false);
    return {loss, denom};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad_loss = grads[0];
    if (!grad_loss.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = call_packed_loss_backward(grad_loss, saved[3], saved[0], saved[1],
                                                saved[2]);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> packed_loss_autograd(const at::Tensor& pred,
                                                        const at::Tensor& boxes,
                                                        const at::Tensor& index,
                                                        const at::Tensor& offsets) {
  auto out = PackedGiouLoss::apply(pred, boxes, index, offsets);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(giou_cuda, Autograd, m) {
  m.impl("loss", &loss_autograd);
  m.impl("packed_loss", &packed_loss_autograd);
}
