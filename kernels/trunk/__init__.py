"""The conv trunk's blocks as Triton kernels, each a torch custom op with autograd and a
fake implementation; the step's speed-ups (training/speedups/) swap them into BoxNet.

    first_block.py     uint8 image -> conv 1->4 -> max-pool -> ReLU, forward and backward
    second_block.py    conv 4->16 -> max-pool -> ReLU as tensor-core dots
    pool.py            a block's bias, max-pool and ReLU around cuDNN's bias-free conv
    conv_pool.py       the third block's forward (conv 16->64, bias, pool, ReLU) in one kernel
    conv_pool_bwd.py   its backward from the pooled gradient and the pool's code
    window.py          what they share about a 2x2 max-pool window
"""
