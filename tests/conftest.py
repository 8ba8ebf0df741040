"""Test-wide setup and the fixtures tests in several folders share. On a machine without a GPU, Triton kernels run
in the interpreter; the flag must be set before Triton is imported anywhere, which is why it lives here at the
root."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# One demo-model build per test session, outside the user's cache (tests that need their own set it themselves).
if "CATENGINE_CACHE" not in os.environ:
    import tempfile

    os.environ["CATENGINE_CACHE"] = tempfile.mkdtemp(prefix="catengine-test-cache-")


@pytest.fixture(scope="module")
def single_thread():
    """The models of the engine tests are tiny: one intra-op thread is fastest, and on a shared CI machine extra
    OpenMP threads spin against other processes. A module opts in with
    ``pytestmark = pytest.mark.usefixtures("single_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """One tiny random Qwen3.5 checkpoint (:func:`catengine.tools.tiny_model.write_tiny_model`) per session."""
    from catengine.tools.tiny_model import write_tiny_model   # here, not at the top: Triton's flag is set first
    path = tmp_path_factory.mktemp("tiny_qwen35")
    write_tiny_model(path)
    return path
