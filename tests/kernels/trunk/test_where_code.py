"""The PTX that the trunk's backward kernels run for `g where code == d` (window.where_code),
read instruction by instruction and executed by the PTX ISA's rules on the CPU (the
interpreter runs tl.where instead, so no other CPU test reaches it): for every pooled
code 0-4 in every byte, every d, and random bf16 bits, the select bit for bit. The GPU
tests (test_conv_pool_bwd) check the compiled kernel against the reference."""

import random
import re

import pytest

from kernels.trunk.window import eq_asm

MASK = 0xFFFFFFFF


def _prmt(a: int, b: int, control: int) -> int:
    """prmt.b32 d, a, b, c in its generic form: each result byte picks one of the 8 bytes
    of {b, a} by its selector's 3 low bits, and where the selector's msb is set
    replicates that byte's sign over the 8 bits."""
    source = (b << 32) | a
    out = 0
    for k in range(4):
        sel = (control >> (4 * k)) & 0xF
        byte = (source >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def _run(asm: str, operands: dict[str, int]) -> dict[str, int]:
    """Executes asm's body (xor, add, and, prmt on .b32/.u32 registers) on operands."""
    regs = dict(operands)
    body = asm.strip().removeprefix("{").removesuffix("}")

    def value(token: str) -> int:
        return int(token, 0) if token[0].isdigit() else regs[token]
    for instr in filter(None, (part.strip() for part in body.split(";"))):
        op, args = instr.split(None, 1)
        args = [a.strip() for a in args.split(",")]
        if op == ".reg":
            continue
        if op == "xor.b32":
            regs[args[0]] = value(args[1]) ^ value(args[2])
        elif op == "add.u32":
            regs[args[0]] = (value(args[1]) + value(args[2])) & MASK
        elif op == "and.b32":
            regs[args[0]] = value(args[1]) & value(args[2])
        elif op == "prmt.b32":
            regs[args[0]] = _prmt(value(args[1]), value(args[2]), value(args[3]))
        else:
            raise AssertionError(f"an instruction this test cannot execute: {instr}")
    return regs


@pytest.mark.parametrize("d", range(4))
def test_the_masks_select_g_where_the_code_is_d(d):
    rng = random.Random()
    asm = eq_asm(d)
    assert re.search(r"\$[0-4]", asm) and "\n" not in asm  # Inductor's copy needs one line
    codes = [(c0, c1, c2, c3) for c0 in range(5) for c1 in range(5)
             for c2 in range(5) for c3 in range(5)]
    for code in codes:
        g = [rng.getrandbits(16) for _ in range(4)]
        out = _run(asm, {"$2": g[0] | g[1] << 16, "$3": g[2] | g[3] << 16,
                         "$4": sum(c << (8 * k) for k, c in enumerate(code))})
        got = [out["$0"] & 0xFFFF, out["$0"] >> 16, out["$1"] & 0xFFFF, out["$1"] >> 16]
        assert got == [gk if ck == d else 0 for gk, ck in zip(g, code)], (code, g)
