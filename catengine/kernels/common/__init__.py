"""What the kernel families share: the per-architecture rows of the launch tables (``arch``), the
ahead-of-time build (``aot``), the split-K reduce of the W4A16 and MoE kernels (``splitk``) and the fp8
e5m2 bit tricks, in Triton (``e5m2_jit``) and in torch (``e5m2``)."""
