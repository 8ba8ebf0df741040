"""Test-wide setup. On a machine without a GPU, Triton kernels run in the interpreter; the flag must be
set before Triton is imported anywhere, which is why it lives here at the root."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# One demo-model build per test session, outside the user's cache (tests that need their own set it themselves).
if "CATENGINE_CACHE" not in os.environ:
    import tempfile

    os.environ["CATENGINE_CACHE"] = tempfile.mkdtemp(prefix="catengine-test-cache-")
