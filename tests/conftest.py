"""Test-wide setup and the fixtures tests in several folders share. On a machine without a GPU, Triton kernels run
in the interpreter; the flag must be set before Triton is imported anywhere, which is why it lives here at the
root."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def _shim_interpreter_index():
    """Triton 3.5/3.6's interpreter turns a scalar tensor into a Python int (a ``range`` bound in a kernel loop) with
    ``int(data)`` on its 1-element, 1-d array, which NumPy 2.x refuses ("only 0-dimensional arrays can be converted
    to Python scalars"); Triton 3.9 squeezes the array first. The same here, so that the CPU suite runs under the
    Tritons V100 users have (bench/aot_triton_versions.sh). Only the interpreter is touched."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 7):
        return
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope=None):   # 3.6 passes a patch scope, 3.5 sets attributes directly
        if scope is None:
            original(tensor)
            tensor.__index__ = lambda self: int(self.handle.data.squeeze())
        else:
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
    interpreter._patch_lang_tensor = patch_lang_tensor


_shim_interpreter_index()

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
