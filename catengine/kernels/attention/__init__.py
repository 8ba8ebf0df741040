"""Paged attention: the KV store (``kv_store``), the prefill/decode kernel and its host side (``paged``),
the pieces it is built from (``decode``: key-tile gather, split-KV reduce) and its launch tables
(``launch``); twins in ``naive.py``. The sm_70 (Gluon HMMA.884) kernels will go beside the Triton ones here."""

# The engine's default KV block size (tokens per page): EngineConfig.block_size defaults to it and the
# ahead-of-time list builds the kernels for it (they specialise on the block size). One owner, here at the
# bottom layer, because config.py may import kernels but kernels may not import config.
DEFAULT_BLOCK_SIZE = 16
