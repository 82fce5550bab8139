"""lin1's update (65,536 x 16,384 weights: 98 % of the model's parameters), in Triton.

    shadow_sgd.py        SGD with momentum for a bf16 weight with fp32 master weights: one
                         pass that reads the bf16 gradient and writes the bf16 weight
    dw_update.py         that update inside the weight-gradient GEMM's epilogue
    deferred_linear.py   the linear layer whose weight gradient is left to that GEMM
"""
