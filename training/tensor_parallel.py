"""--parallel tp's head with plain tensors and collectives: lin1 column-parallel, lin2
row-parallel over a process group of N ranks, each rank holding 1/N of lin1's rows (and
of its bias) and of lin2's columns.

Why not DTensor's parallelize_module: its eager dispatch and hooks are Python on every op
of the head, and each rank's host needed about twice one GPU's time a step under it. Here
the head is a dozen ATen calls and four collectives; the features' all-gather hides
behind this rank's own rows' GEMM, dx's reduce-scatter behind lin1's weight-gradient GEMM
(BESIDE: a speed-up may run those two otherwise; COLLECTIVES: how those two collectives
move their bytes, NCCL's unless a speed-up swaps them). The maths, the bytes, what hides
what: docs/design.md, this module's section."""

import types
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

# torch 2.13 renamed the single-tensor collectives (the old names warn there; 2.11 has
# only those).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def gemm_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype autocast would give a GEMM on x's device, or x's own without autocast."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def own_rows_gemm(bias, x, weight, out) -> None:
    """out = x @ weight^T + bias: this rank's own rows of lin1's forward."""
    torch.addmm(bias, x, weight.t(), out=out)


def weight_gradient_gemm(dy, full) -> torch.Tensor:
    """dW = dy^T @ full: lin1's weight gradient."""
    return dy.t().mm(full)


@dataclass
class Beside:
    """The two GEMMs that run while a collective is in flight (the module's docstring says
    which), read at every call: a speed-up's process flag swaps them for a run."""
    own_rows: Callable = own_rows_gemm
    weight_gradient: Callable = weight_gradient_gemm


BESIDE = Beside()


def nccl_gather(x, group):
    """(full, wait): x's rows of every rank gathered into full by NCCL, started; wait()
    makes the current stream wait for it (no host sync)."""
    full = x.new_empty((dist.get_world_size(group) * x.shape[0], x.shape[1]))
    work = _all_gather(full, x, group=group, async_op=True)
    return full, work.wait


def plain_buffer(rows: int, columns: int, like: torch.Tensor, group=None) -> torch.Tensor:
    """Where the backward's dX GEMM writes every rank's rows of dx, to be reduce-scattered."""
    return like.new_empty((rows, columns))


def nccl_scatter(dx_full, group, batch: int):
    """finish: dx_full's rows summed over the ranks, this rank's batch of them, by NCCL,
    started; finish() makes the current stream wait (no host sync) and returns them."""
    dx = dx_full.new_empty((batch, dx_full.shape[1]))
    work = _reduce_scatter(dx, dx_full, group=group, async_op=True)

    def finish():
        work.wait()
        return dx
    return finish


@dataclass
class Collectives:
    """How the features' all-gather and dx's reduce-scatter move their bytes, read at
    every call: a speed-up's process flag swaps them for a run."""
    gather: Callable = nccl_gather
    scatter_buffer: Callable = plain_buffer
    scatter: Callable = nccl_scatter


COLLECTIVES = Collectives()


def _rows_of(index: int, batch: int) -> slice:
    return slice(index * batch, (index + 1) * batch)


class _GatherLinear(torch.autograd.Function):
    """y = all-gather(x) @ W^T + b over the group; backward: dx reduce-scattered behind
    the weight's gradient GEMM. Every input already in the GEMM's dtype."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, index):
        parts, batch = dist.get_world_size(group), x.shape[0]
        full, gathered = COLLECTIVES.gather(x, group)
        out = x.new_empty((parts * batch, weight.shape[0]))
        own = _rows_of(index, batch)
        with torch.autocast(x.device.type, enabled=False):
            BESIDE.own_rows(bias, x, weight, out[own])  # beside the gather
            gathered()  # the current stream waits for the gather; no host sync
            for rows in (slice(0, own.start), slice(own.stop, parts * batch)):
                if rows.stop > rows.start:
                    torch.addmm(bias, full[rows], weight.t(), out=out[rows])
        ctx.save_for_backward(full, weight)
        ctx.group, ctx.batch = group, batch
        return out

    @staticmethod
    def backward(ctx, dy):
        full, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx_full = COLLECTIVES.scatter_buffer(dy.shape[0], weight.shape[1], dy, ctx.group)
        torch.mm(dy, weight, out=dx_full)
        scattered = COLLECTIVES.scatter(dx_full, ctx.group, ctx.batch)
        dw = BESIDE.weight_gradient(dy, full)  # beside the reduce-scatter
        db = dy.sum(0)
        dx = scattered()  # a stream dependency, no host sync
        return dx, dw, db, None, None


class _ScatterRows(torch.autograd.Function):
    """Partial sums [N*B, O] -> this rank's rows of their sum [B, O]; backward: the
    gradient's rows all-gathered."""

    @staticmethod
    def forward(ctx, partial, group):
        parts = dist.get_world_size(group)
        out = partial.new_empty((partial.shape[0] // parts, *partial.shape[1:]))
        _reduce_scatter(out, partial.contiguous(), group=group)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dz):
        parts = dist.get_world_size(ctx.group)
        full = dz.new_empty((parts * dz.shape[0], *dz.shape[1:]))
        _all_gather(full, dz.contiguous(), group=ctx.group)
        return full, None


def _column_forward(group, index):
    def forward(self, x):
        dtype = gemm_dtype(x)
        return _GatherLinear.apply(x.to(dtype).contiguous(), self.weight.to(dtype),
                                   self.bias.to(dtype), group, index)
    return forward


def _row_forward(group):
    def forward(self, h):
        dtype = gemm_dtype(h)
        partial = F.linear(h.to(dtype), self.weight.to(dtype))
        return _ScatterRows.apply(partial, group) + self.bias.to(dtype)
    return forward


def parallelize_head(model, group) -> list:
    """lin1 and lin2 of the model cut to this rank's shards of `group` and their forwards
    rebound to the ones above (their parameter names kept); returns the parameters that
    are now shards. Every rank built the same model from the same seed, so each keeps its
    own rows of the same full tensors."""
    parts, index = dist.get_world_size(group), dist.get_rank(group)
    lin1, lin2 = model.lin1, model.lin2
    with torch.no_grad():
        lin1.weight = torch.nn.Parameter(lin1.weight.chunk(parts)[index].clone())
        lin1.bias = torch.nn.Parameter(lin1.bias.chunk(parts)[index].clone())
        lin2.weight = torch.nn.Parameter(lin2.weight.chunk(parts, dim=1)[index].contiguous())
    lin1.forward = types.MethodType(_column_forward(group, index), lin1)
    lin2.forward = types.MethodType(_row_forward(group), lin2)
    return [lin1.weight, lin1.bias, lin2.weight]
