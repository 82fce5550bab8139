"""lin1's update (65,536 x 16,384 weights: 98 % of the model's parameters), in Triton.

    shadow_sgd.py        SGD with momentum for a bf16 weight with fp32 master weights: one
                         pass that reads the bf16 gradient and writes the bf16 weight
    master_halves.py     the fp32 master as the bf16 weight, a 16-bit low half and a tie
                         bit (--split-master): 2 bytes an element beyond the weight, exact

(The update inside the weight-gradient GEMM's epilogue, in Triton and then in a
warp-specialised CUTLASS kernel, was measured no faster than the GEMM and this pass apart,
and left: results/step.md.)
"""
