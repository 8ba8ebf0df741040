"""Test-wide setup. On a machine without a GPU, Triton kernels run in the interpreter; the flag must be
set before Triton is imported anywhere, which is why it lives here at the root."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
