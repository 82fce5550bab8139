"""Each trunk kernel's registers and per-thread stack frame on sm_90a, from the binary
Triton builds, on any machine: no GPU needed. A spilling kernel's frame sizes the
context's local memory for every thread the GPU can hold, for the process's life (a
55,728-byte frame was 15 GB of the H100's 80). Nothing is launched; the cubin's own
resource usage is read with cuobjdump.

    python3 bench/kernel_stack.py [--only 'conv_pool fp32'] [--max-frame BYTES]

Exit 1 if any kernel's frame is over --max-frame. The design in full: docs/design.md,
this module's section."""

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, never interpreted: read at import
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, ".")
TARGET = GPUTarget("cuda", 90, 32)


# cuobjdump ships beside Triton's ptxas (Triton 3.6 and 3.9 alike).
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "cuobjdump")
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
         torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64",
         torch.bool: "i1"}


def signature(kernel, args, meta) -> tuple[dict, dict]:
    """Triton's signature and constexprs for a call: pointers typed by their tensors'
    dtypes, ints as i32 (i64 past 2^31), floats as fp32, meta as constexprs."""
    sig, const = {}, {}
    for name, value in zip(kernel.arg_names, args):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + TYPES[value.dtype]
        elif isinstance(value, bool) or value is None:
            sig[name], const[name] = "constexpr", value
        elif isinstance(value, int):
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name], const[name] = "constexpr", value
    for name in kernel.arg_names[len(args):]:
        if name in meta:
            sig[name], const[name] = "constexpr", meta[name]
    return sig, const


def resource_usage(kernel, args, meta) -> dict:
    """registers and stack frame bytes of one call's kernel, from the cubin Triton built."""
    sig, const = signature(kernel, args, meta)
    options = {k: v for k, v in meta.items() if k in ("num_warps", "num_stages")}
    compiled = triton.compile(ASTSource(kernel, signature=sig, constexprs=const),
                              target=TARGET, options=options)
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        out = subprocess.run([CUOBJDUMP, "-res-usage", cubin], capture_output=True,
                             text=True, check=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if usage is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no REG/STACK line: {out[-500:]}")
    return {"registers": int(usage.group(1)), "frame": int(usage.group(2))}


def _conv(c_in, c_out, size, dtype, fmt, weight_dtype=None):
    """x [2, c_in, size, size] in dtype, weight and bias in weight_dtype (dtype's by
    default), all needing gradients."""
    x = torch.randn(2, c_in, size, size, dtype=dtype).to(memory_format=fmt)
    w = torch.randn(c_out, c_in, 3, 3, dtype=weight_dtype or dtype)
    b = torch.randn(c_out, dtype=weight_dtype or dtype)
    return [t.requires_grad_() for t in (x, w, b)]


def calls():
    """(what, thunk) for each trunk op, forward and backward, at each dtype and layout:
    small CPU tensors (their values never matter: nothing runs)."""
    from kernels.trunk import conv_pool, first_block, pool, second_block
    images = torch.randint(0, 256, (2, 1, 8, 8), dtype=torch.uint8)
    w1, b1 = torch.randn(4, 1, 3, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    for nhwc in (False, True):
        yield (f"first_block fp32 {'NHWC' if nhwc else 'NCHW'}",
               lambda: first_block.first_block(images, w1, b1, torch.float32, nhwc))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for fmt in (torch.contiguous_format, torch.channels_last):
            tag = f"{TYPES[dtype]} {'NHWC' if fmt == torch.channels_last else 'NCHW'}"
            nhwc = fmt == torch.channels_last
            yield (f"first_block_code {tag}",  # dtype: its output's, the weight fp32
                   lambda: first_block.first_block(images, w1, b1, dtype, nhwc, True))
            x, w, b = _conv(4, 16, 8, dtype, fmt, torch.float32)  # fp32 masters
            yield f"second_block {tag}", lambda: second_block.second_block(x, w, b)
            x3, w3, b3 = _conv(16, 64, 8, dtype, fmt)
            yield (f"conv_pool {tag}",
                   lambda: conv_pool.conv_pool_bias_relu(x3, w3, b3, triton_backward=True))
            x4, _, b4 = _conv(64, 64, 8, dtype, fmt)
            yield f"pool {tag}", lambda: pool.pool_bias_relu(x4, b4)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-frame", type=int, default=None,
                        help="exit 1 if a kernel's stack frame is over this many bytes")
    parser.add_argument("--only", default="",
                        help="the calls whose name holds this text ('conv_pool fp32', say)")
    args = parser.parse_args(argv)
    from kernels.triton_op import launch
    seen = []

    def record(kernel, grid, *call_args, **meta):
        seen.append((kernel.fn.__name__, resource_usage(kernel, call_args, meta)))
    rows, over = [], []
    for what, thunk in calls():
        if args.only not in what:
            continue
        seen.clear()
        for module in list(sys.modules.values()):
            if getattr(module, "launch", None) is launch:
                module.launch = record
        try:
            thunk().float().sum().backward()
        finally:
            for module in list(sys.modules.values()):
                if getattr(module, "launch", None) is record:
                    module.launch = launch
        for name, report in seen:
            lmem_gb = report["frame"] * 2048 * 132 / 1e9
            rows.append(f"| {what} | {name} | {report['registers']} | {report['frame']} | "
                        f"{lmem_gb:.2f} |")
            if args.max_frame is not None and report["frame"] > args.max_frame:
                over.append(f"{what}: {name} {report['frame']} bytes")
    print("| call | kernel | registers | stack frame bytes | H100 local memory GB |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(rows))
    if over:
        print(f"over {args.max_frame} bytes: " + "; ".join(over), file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
