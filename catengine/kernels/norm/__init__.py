"""Norms, RoPE and small elementwise ops: RMSNorm, gated RMSNorm, SiLU-and-mul, QK norm + RoPE
(``norm_rope``); twins, and the RoPE cos/sin table, in ``naive.py``. The sm_70 (Gluon HMMA.884) kernels
will go beside the Triton ones here."""
