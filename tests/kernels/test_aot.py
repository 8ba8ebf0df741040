"""Every launch configuration of every Triton module compiles ahead of time for sm_70 (within the V100's
96 KB of shared memory and without sm_80+ instructions) and for sm_90. No GPU needed."""
import importlib.util

import pytest

from catengine.kernels.aot import SM70_SHARED_LIMIT, compile_module
from catengine.kernels.ops import TRITON_MODULES

PRESENT = [m for m in TRITON_MODULES if importlib.util.find_spec(m) is not None]


@pytest.mark.parametrize("module", PRESENT)
@pytest.mark.parametrize("cc", [70, 90])
def test_module_compiles(module, cc):
    results = compile_module(module, cc)
    assert results, f"{module} lists no aot_configs for sm_{cc}"
    for r in results:
        if cc == 70:
            assert r["shared"] <= SM70_SHARED_LIMIT, f"{r} needs more shared memory than a V100 block has"
            assert not r["forbidden"], f"{r} emits instructions sm_70 lacks"
