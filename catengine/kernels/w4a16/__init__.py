"""W4A16 linear (int4 weights, fp16/bf16 activations): the weight format (``packing``), the GEMV and GEMM
kernels with the dequantisation fused in (``gemv``, ``gemm``), the dequantise + cuBLAS path for large M
and the op's one CUDA entry point (``dequant.w4a16_linear``); twin in ``naive.py``. The sm_70 (Gluon
HMMA.884) kernels will go beside the Triton ones here."""
