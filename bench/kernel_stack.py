"""Each trunk kernel's registers and per-thread stack frame on sm_90a, from the binary
Triton builds, on any machine: no GPU needed. A spilling kernel's frame sizes the
context's local memory for every thread the GPU can hold, for the process's life (a
55,728-byte frame was 15 GB of the H100's 80). Nothing is launched; the cubin's own
resource usage is read with cuobjdump.

    python3 bench/kernel_stack.py [--only 'conv_pool fp32'] [--max-frame BYTES]
                                  [--as-step] [--sass]

Exit 1 if any kernel's frame is over --max-frame. The design in full: docs/design.md,
this module's section."""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

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


def signature(kernel, args, meta, specialise: bool = False) -> tuple[dict, dict, dict]:
    """Triton's signature, constexprs and attributes for a call: pointers typed by their
    tensors' dtypes, ints as i32 (i64 past 2^31), floats as fp32, meta and the parameters
    the kernel declares tl.constexpr as constexprs.
    specialise: as Inductor's launch in the compiled step does, an int equal to 1 is a
    constant, and an int divisible by 16 and a 16-byte aligned pointer are marked so."""
    sig, const, attrs = {}, {}, {}
    declared = {param.name for param in kernel.params if param.is_constexpr}
    for index, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if name in declared:  # a tl.constexpr passed by position (SXW, say)
            sig[name], const[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + TYPES[value.dtype]
            if specialise and value.data_ptr() % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool) or value is None:
            sig[name], const[name] = "constexpr", value
        elif isinstance(value, int):
            if specialise and value == 1:
                sig[name], const[name] = "constexpr", 1
                continue
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if specialise and value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name], const[name] = "constexpr", value
    for name in kernel.arg_names[len(args):]:
        if name in meta:
            sig[name], const[name] = "constexpr", meta[name]
    return sig, const, attrs


def opcode_mix(sass: str, top: int = 8) -> str:
    """'IMAD 299, ISETP 212, ...': the cubin's most frequent SASS opcodes (loads and stores
    with their width), counted in its text as cuobjdump -sass prints it."""
    counts = Counter()
    for line in sass.splitlines():
        found = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)((?:\.[A-Z0-9_]+)*)",
                         line)
        if found:
            op, suffix = found.groups()
            counts[op + (suffix if op in ("LDG", "STG", "LDS", "STS") else "")] += 1
    return f"{sum(counts.values())}: " + ", ".join(f"{op} {n}" for op, n in counts.most_common(top))


def resource_usage(kernel, args, meta, specialise: bool = False, sass: bool = False) -> dict:
    """registers and stack frame bytes of one call's kernel, from the cubin Triton built;
    with sass, its opcode mix too."""
    sig, const, attrs = signature(kernel, args, meta, specialise)
    options = {k: v for k, v in meta.items() if k in ("num_warps", "num_stages")}
    compiled = triton.compile(ASTSource(kernel, signature=sig, constexprs=const, attrs=attrs),
                              target=TARGET, options=options)
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        out = subprocess.run([CUOBJDUMP, "-res-usage", cubin], capture_output=True,
                             text=True, check=True).stdout
        code = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True,
                              check=True).stdout if sass else ""
    usage = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if usage is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no REG/STACK line: {out[-500:]}")
    report = {"registers": int(usage.group(1)), "frame": int(usage.group(2))}
    if sass:
        report["sass"] = opcode_mix(code)
    return report


def _conv(c_in, c_out, size, dtype, fmt, weight_dtype=None):
    """x [2, c_in, size, size] in dtype, weight and bias in weight_dtype (dtype's by
    default), all needing gradients."""
    x = torch.randn(2, c_in, size, size, dtype=dtype).to(memory_format=fmt)
    w = torch.randn(c_out, c_in, 3, 3, dtype=weight_dtype or dtype)
    b = torch.randn(c_out, dtype=weight_dtype or dtype)
    return [t.requires_grad_() for t in (x, w, b)]


def calls(side: int | None = None):
    """(what, thunk) for each trunk op, forward and backward, at each dtype and layout:
    CPU tensors of 2 samples (their values never matter: nothing runs), each block's input
    8 pixels a side, or at images `side` pixels a side, each block's half the one before
    (and the pool on the fourth conv's 256 channels, flat, as the step runs it)."""
    from kernels.trunk import conv_pool, first_block, pool, second_block
    sides = [8] * 4 if side is None else [side // 2 ** i for i in range(4)]
    images = torch.randint(0, 256, (2, 1, sides[0], sides[0]), dtype=torch.uint8)
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
            x, w, b = _conv(4, 16, sides[1], dtype, fmt, torch.float32)  # fp32 masters
            yield f"second_block {tag}", lambda: second_block.second_block(x, w, b)
            x3, w3, b3 = _conv(16, 64, sides[2], dtype, fmt)
            yield (f"conv_pool {tag}",
                   lambda: conv_pool.conv_pool_bias_relu(x3, w3, b3, triton_backward=True))
            # Flat for lin1, the pool's gradient is pixel-contiguous: its backward's layouts.
            c4 = 64 if side is None else 256
            x4, _, b4 = _conv(c4, c4, sides[3], dtype, fmt)
            yield f"pool {tag}", lambda: pool.pool_bias_relu(x4, b4, flat=side is not None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-frame", type=int, default=None,
                        help="exit 1 if a kernel's stack frame is over this many bytes")
    parser.add_argument("--only", default="",
                        help="the calls whose name holds this text ('conv_pool fp32', say)")
    parser.add_argument("--as-step", action="store_true",
                        help="each kernel built as the compiled step's launch builds it: at "
                        "the GPU preset's 256-pixel images, its arguments specialised")
    parser.add_argument("--sass", action="store_true",
                        help="each kernel's SASS instructions and its most frequent opcodes")
    args = parser.parse_args(argv)
    from kernels.triton_op import launch
    seen = []

    def record(kernel, grid, *call_args, **meta):
        seen.append((kernel.fn.__name__,
                     resource_usage(kernel, call_args, meta, args.as_step, args.sass)))
    rows, over = [], []
    for what, thunk in calls(256 if args.as_step else None):
        if args.only not in what:
            continue
        seen.clear()
        for module in list(sys.modules.values()):
            if getattr(module, "launch", None) is launch:
                module.launch = record
        try:
            out = thunk()
            # As the step: the gradient in the output's dtype and layout (a plain sum's is a
            # broadcast one, whose strides build another kernel).
            if args.as_step:
                out.backward(torch.randn_like(out))
            else:
                out.float().sum().backward()
        finally:
            for module in list(sys.modules.values()):
                if getattr(module, "launch", None) is record:
                    module.launch = launch
        for name, report in seen:
            lmem_gb = report["frame"] * 2048 * 132 / 1e9
            rows.append(f"| {what} | {name} | {report['registers']} | {report['frame']} | "
                        f"{lmem_gb:.2f} |" + (f" {report['sass']} |" if args.sass else ""))
            if args.max_frame is not None and report["frame"] > args.max_frame:
                over.append(f"{what}: {name} {report['frame']} bytes")
    print("| call | kernel | registers | stack frame bytes | H100 local memory GB |"
          + (" SASS instructions: the most frequent |" if args.sass else ""))
    print("|---|---|---:|---:|---:|" + ("---|" if args.sass else ""))
    print("\n".join(rows))
    if over:
        print(f"over {args.max_frame} bytes: " + "; ".join(over), file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
