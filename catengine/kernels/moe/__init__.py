"""Mixture of experts: routing and token alignment (``route``), the routed experts for dense and W4A16
weights (``fused``) and their few-token W4A16 decode kernels (``decode``); twins in ``naive.py``. The
sm_70 (Gluon HMMA.884) kernels will go beside the Triton ones here."""
