"""Triton kernels, one package per op family, each with its torch twin in ``naive.py``; call ops through
:mod:`catengine.kernels.ops` (the Triton kernel on CUDA, the twin elsewhere).

Families: ``w4a16`` (int4-weight linear), ``moe`` (routing, routed experts), ``attention`` (paged KV store
and attention), ``gdn`` (Gated DeltaNet conv1d, gating, gated delta rule), ``norm`` (norms, RoPE, SiLU-mul),
``sampling`` (the sampler), ``skinny`` (dense 16-bit linears with few columns at decode sizes); ``common``
holds what they share (arch rows, AOT build, split-K reduce and arrival counters, fp8 e5m2 bits). Shapes
in docstrings use: T new tokens in the flat batch, B sequences, H hidden size, nh/nkv attention heads, d head
dim, Hk/Hv linear-attention key/value heads, dk/dv their head dims, C conv channels, Kc conv kernel, V
vocabulary, E experts.
"""
