"""W8A16 linear for the lm_head (``--quantize-lm-head int8``): int8 weights with one symmetric scale per output
channel, fp16/bf16 activations, fp32 logits. ``naive.py`` holds the quantiser and the twin, ``gemv.py`` the
Triton kernel for the sampling rows (M up to max_num_seqs)."""
