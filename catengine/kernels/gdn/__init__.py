"""Gated DeltaNet: causal conv1d (``conv1d``), the chunked gated delta rule (``chunk``, with its kernels in
``chunk_wy``, ``chunk_h``, ``chunk_o``), the gating and the recurrent form (``recurrent``), and the table
and checks both forms share (``table``); twins in ``naive.py``. The sm_70 (Gluon HMMA.884) kernels will go
beside the Triton ones here."""
