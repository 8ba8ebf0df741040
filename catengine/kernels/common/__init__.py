"""What the kernel families share: the per-architecture rows of the launch tables (``arch``), the
ahead-of-time build (``aot``), the HMMA.884 building block of the sm_70 kernels (``mma884``, Gluon) with
its proof GEMM (``gemm884``), the split-K reduce of the W4A16 and MoE kernels (``splitk``) and the fp8
e5m2 bit tricks, in Triton (``e5m2_jit``) and in torch (``e5m2``)."""
