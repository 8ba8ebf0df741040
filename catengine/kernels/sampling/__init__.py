"""Token sampling (temperature, top-k, top-p, min-p, counter-based random streams) in ``sampler``; twin in
``naive.py``. The sm_70 (Gluon HMMA.884) kernels will go beside the Triton ones here."""
