"""CATENGINE_ARCH: one switch moves every launch-table row and every choice made by architecture (CPU side; the
engine end to end under CATENGINE_ARCH=70 on a GPU is tests/test_arch70_gpu.py)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from catengine.config import check_dtype_supported
from catengine.errors import ConfigError
from catengine.kernels.attention import launch as attn_launch
from catengine.kernels.attention import kv_store
from catengine.kernels.common import arch
from catengine.kernels.gdn import conv1d, table as gdn_table
from catengine.kernels.moe import fused as moe_fused
from catengine.kernels.norm import norm_rope
from catengine.kernels.sampling import sampler
from catengine.kernels.w4a16 import dequant, gemm

CPU, CUDA = torch.device("cpu"), torch.device("cuda")   # a cuda device object needs no GPU to exist


@pytest.fixture
def forced(monkeypatch):
    """Set the switch as the module read it; the per-device caches of the GDN tables are emptied around it so that
    no forced row leaks into other tests."""
    def force(value: str):
        monkeypatch.setattr(arch, "ARCH_OVERRIDE", value)
        gdn_table.device_table.cache_clear()
        conv1d.device_table.cache_clear()
    yield force
    gdn_table.device_table.cache_clear()
    conv1d.device_table.cache_clear()


# family -> the row its launcher picks for a device (the same expression the launcher evaluates)
LOOKUPS = {
    "w4a16 gemm": (lambda d: gemm.TABLES[arch.device_key(d)[0]], lambda a: gemm.TABLES[f"sm{a}"]),
    "w4a16 dequant": (lambda d: dequant.DEQUANT_MIN_M[arch.device_key(d)[0]],
                      lambda a: dequant.DEQUANT_MIN_M[f"sm{a}"]),
    "moe": (lambda d: moe_fused.TABLES[arch.device_key(d)[0]], lambda a: moe_fused.TABLES[f"sm{a}"]),
    "attention prefill": (lambda d: attn_launch.table_launch(arch.arch_of(d), 256, False, False),
                          lambda a: attn_launch.PREFILL[(a, 256)]),
    "attention decode e5m2": (lambda d: attn_launch.table_launch(arch.arch_of(d), 256, True, True),
                              lambda a: attn_launch.DECODE_E5M2[(a, 256)]),
    "kv store": (lambda d: kv_store._WARPS[arch.arch_of(d)], lambda a: kv_store._WARPS[a]),
    "gdn": (lambda d: gdn_table.device_table(d), lambda a: gdn_table.TABLE[a]),
    "gdn conv1d": (lambda d: conv1d.device_table(d), lambda a: conv1d.TABLE[a]),
    "norm": (lambda d: norm_rope._launch(d, "silu_mul"), lambda a: norm_rope.TABLE[a]["silu_mul"]),
    "sampling": (lambda d: sampler.TABLE[arch.arch_of(d)], lambda a: sampler.TABLE[a]),
}


@pytest.mark.parametrize("family", sorted(LOOKUPS))
@pytest.mark.parametrize("device", [CPU, CUDA], ids=["cpu", "cuda"])
def test_switch_picks_the_sm70_rows(forced, family, device):
    lookup, row = LOOKUPS[family]
    forced("70")
    # on "cuda" (no GPU here) an ignored switch would ask torch for the device's capability and fail
    assert lookup(device) == row(70)


def test_switch_tables_differ_where_a_v100_differs(forced):
    """The sm_70 choices the switch must reach on an H200: no PDL (griddepcontrol needs sm_90), the GDN split
    form with its HMMA.884 stages and ieee products (no tf32), a V100's 80 SMs for the split counts."""
    forced("70")
    key, sms = arch.device_key(CUDA)
    assert (key, sms) == ("sm70", 80)
    assert not gemm.TABLES[key].gemv.pdl and moe_fused.TABLES[key].decode_pdl == 0
    t = gdn_table.device_table(CUDA)
    assert t.prefill == "split" and t.o_hmma and t.h_hmma and t.wy_dot == "ieee"
    forced("90")
    assert arch.device_key(CUDA) == ("sm90", 132) and gemm.TABLES["sm90"].gemv.pdl
    assert arch.device_key(CPU) == ("sm90", arch.INTERPRETER_SMS)   # the interpreter keeps its small chip


@pytest.mark.parametrize("device", [CPU, CUDA], ids=["cpu", "cuda"])
def test_switch_refuses_bf16_as_a_v100(forced, device):
    forced("70")
    with pytest.raises(ConfigError, match="bfloat16 needs an sm_80"):
        check_dtype_supported(torch.bfloat16, device)
    check_dtype_supported(torch.float16, device)
    forced("80")
    check_dtype_supported(torch.bfloat16, device)


def test_without_switch_the_cpu_keeps_its_rows(forced):
    forced("")
    assert arch.forced_arch() is None
    assert arch.arch_of(CPU) == 80 and arch.device_key(CPU) == ("sm90", arch.INTERPRETER_SMS)
    check_dtype_supported(torch.bfloat16, CPU)


@pytest.mark.parametrize("value", ["75", "sm70", "100", "seventy", "7 0"])
def test_invalid_value_is_a_config_error_naming_the_rows(forced, value):
    forced(value)
    for call in (arch.forced_arch, lambda: arch.arch_of(CPU), lambda: arch.device_key(CUDA),
                 lambda: check_dtype_supported(torch.float16, CPU)):
        with pytest.raises(ConfigError, match="70, 80, 90"):
            call()


def _in_subprocess(value: str) -> subprocess.CompletedProcess:
    code = ("import json, torch\n"
            "from catengine.errors import ConfigError\n"
            "from catengine.kernels.common import arch\n"
            "from catengine.config import check_dtype_supported\n"
            "try:\n"
            "    check_dtype_supported(torch.bfloat16, torch.device('cuda'))\n"
            "    bf16 = 'ok'\n"
            "except ConfigError as e:\n"
            "    bf16 = str(e)\n"
            "print(json.dumps([arch.arch_of(torch.device('cpu')), list(arch.device_key(torch.device('cuda'))), bf16]))\n")
    env = {**os.environ, "CATENGINE_ARCH": value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_environment_variable_is_read_at_import():
    out = _in_subprocess("70")
    assert out.returncode == 0, out.stderr
    row, key, bf16 = json.loads(out.stdout.strip().splitlines()[-1])
    assert row == 70 and key == ["sm70", 80] and "bfloat16 needs an sm_80" in bf16
    bad = _in_subprocess("86")
    assert bad.returncode != 0 and "ConfigError" in bad.stderr and "70, 80, 90" in bad.stderr
