"""Paged attention: the KV store (``kv_store``), the prefill/decode kernel and its host side (``paged``),
the pieces it is built from (``decode``: key-tile gather, split-KV reduce) and its launch tables
(``launch``); twins in ``naive.py``. The sm_70 (Gluon HMMA.884) kernels will go beside the Triton ones here."""
