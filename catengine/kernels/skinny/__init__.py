"""Dense fp16/bf16 linears with few output columns at decode sizes (the fp16 projections an AWQ checkpoint keeps:
GDN ``in_proj_ba``, the MoE router + shared-expert gate): one launch whose last split reduces in-kernel, in
``skinny``; twin in ``naive.py``."""
