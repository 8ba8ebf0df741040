"""bench/v100_projection.py's CPU side: launch recording into AotConfigs, the FMA-path switch, the registry's trip
counts and the model steps (the projection itself runs on the GPU machine; its SASS model: test_sass_model.py)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import v100_kernels as reg  # noqa: E402
from v100_record import arch_row, recording  # noqa: E402


def _jit_toy():
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def toy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
        pid = tl.program_id(0)
        tl.store(y_ptr + pid, tl.load(x_ptr + pid) * scale)
    # a JITFunction even under the interpreter (conftest turns it on without a GPU): the recorder patches its run
    return JITFunction(toy)


def test_recording_turns_a_launch_into_an_aot_config_without_running_it():
    k = _jit_toy()
    x = torch.zeros(64, dtype=torch.float16)
    y = torch.zeros(64, dtype=torch.float32)
    with recording(run=False) as launches:
        k[lambda meta: (meta["n"] // meta["BLOCK"], 2)](x, y, 64, 0.5, BLOCK=16, num_warps=2, num_stages=1)
        k[(3,)](x, x, 17, 1.0, BLOCK=32, FLAG=True)
    a, b = launches
    assert a.kernel == "toy" and a.grid == (4, 2, 1) and a.programs == 8 and (a.num_warps, a.num_stages) == (2, 1)
    cfg = a.aot_config()
    assert cfg.signature == {"x_ptr": "*fp16", "y_ptr": "*fp32", "n": "i32", "scale": "fp32", "BLOCK": "constexpr",
                             "FLAG": "constexpr"}
    assert cfg.constexprs == {"BLOCK": 16, "FLAG": False} and cfg.divisible_by_16 == ("n",)
    assert a.tensor_bytes() == 64 * 2 + 64 * 4
    # the same tensor twice counts once; 17 is no multiple of 16; defaults are the launcher's
    assert b.tensor_bytes() == 64 * 2 and b.aot_config().divisible_by_16 == () and (b.num_warps, b.grid) == (4, (3, 1, 1))
    assert b.aot_config().constexprs["FLAG"] is True


def test_fma_path_turns_off_the_sm70_hmma_choice_and_restores_it():
    from catengine.kernels.w4a16 import gemm
    row, pred = gemm.TABLES["sm70"], gemm.hmma_applies
    assert row.hmma_min_m == 2
    with reg.fma_path():
        assert gemm.TABLES["sm70"].hmma_min_m is None and gemm.hmma_applies(None, 64, None, None) is False
    assert gemm.TABLES["sm70"] is row and gemm.hmma_applies is pred


def test_arch_row_moves_device_key_and_restores_it():
    from catengine.kernels.common import arch
    before = arch.ARCH_OVERRIDE
    with arch_row(70):
        assert arch.forced_arch() == 70 and arch.device_key("cpu")[0] == "sm70"
    assert arch.ARCH_OVERRIDE == before


class _L:
    def __init__(self, kernel, **args):
        self.kernel, self.args = kernel, args


@pytest.mark.parametrize("kernel", ["_w4a16_gemm_kernel", "w4a16_gemm_sm70_kernel"])
def test_gemm_trips_are_k_tiles_per_split(kernel):
    trips, modelled = reg.trips_of(_L(kernel, K=5120, BK=32, SPLIT_K=4), {})
    assert modelled and trips == (40.0,)


def test_attention_trips_average_the_causal_triangle():
    shape = {"ctx": 8192, "q": 8192}
    # 64-token query tiles over 8192 causal keys: tile i sees 64 (i + 1) keys, 4128 on average, 64 per key tile
    trips, _ = reg.trips_of(_L("paged_attn_kernel", BLOCK_N=64, TOK=64, NUM_SPLITS=1, TWO_PHASE=False), shape)
    assert trips == (pytest.approx(4128 / 64),)
    # split decode: one query row, the 8K context over 4 splits
    trips, _ = reg.trips_of(_L("paged_attn_kernel", BLOCK_N=32, TOK=1, NUM_SPLITS=4, TWO_PHASE=True),
                            {"ctx": 8192, "q": 1})
    assert trips == (pytest.approx(8192 / 4 / 32 - 1), 1.0)


def test_unknown_kernels_are_flagged_not_modelled():
    assert reg.trips_of(_L("some_new_kernel"), {}) == ((), False)
    assert reg.trips_of(_L("splitk_reduce_kernel"), {}) == ((), True)


def test_model_steps_cover_every_layer():
    rows = reg.model_step("qwen3.5-27b", 8192, 1, 8192)
    calls = {s["label"].split(" M=")[0]: n for op, s, n in rows if op == "w4a16"}
    assert calls["gdn qkv"] == 48 and calls["q+gate"] == 16 and calls["gate_up"] == 64
    assert [n for op, _, n in rows if op == "attn"] == [16] and [n for op, _, n in rows if op == "gdn_chunk"] == [48]
    moe = reg.model_step("qwen3.6-35b-a3b", 1, 32, 8192)
    assert [(s["T"], n) for op, s, n in moe if op == "moe"] == [(32, 40)]
    assert [op for op, _, _ in moe].count("gdn_rec") == 1


def test_record_only_cpu_lets_the_sm70_launchers_take_cpu_tensors(monkeypatch):
    """The projection's CPU dry run: with RECORD_ONLY_CPU the HMMA.884 choices accept CPU tensors and a CPU device
    counts the row's reference SMs (V100 80); without it nothing changes (the interpreter's 4 SMs, CUDA only)."""
    from catengine.kernels.attention import paged_sm70
    from catengine.kernels.common import arch
    from catengine.kernels.gdn import chunk_h_sm70, chunk_o_sm70
    from catengine.kernels.gdn.table import TABLE
    monkeypatch.setattr(paged_sm70, "INTERPRET", False)      # conftest runs the interpreter without a GPU
    q = torch.zeros(4, 6, 256, dtype=torch.float16)
    kc = torch.zeros(2, 16, 1, 256, dtype=torch.float16)
    cpu = torch.device("cpu")
    with arch_row(70):
        assert arch.device_key(cpu) == ("sm70", arch.INTERPRETER_SMS)
        assert not paged_sm70.sm70_applies(70, q, kc) and not chunk_h_sm70.h_hmma_applies(TABLE[70], torch.float16, cpu)
        monkeypatch.setattr(arch, "RECORD_ONLY_CPU", True)
        assert arch.device_key(cpu) == ("sm70", 80) and arch.cuda_device(cpu)
        assert paged_sm70.sm70_applies(70, q, kc)
        assert chunk_h_sm70.h_hmma_applies(TABLE[70], torch.float16, cpu)
        assert chunk_o_sm70.o_hmma_applies(TABLE[70], torch.float16, cpu)
    assert arch.device_key(cpu) == ("sm90", 132) and arch.arch_of(cpu) == 90


def test_fma_path_sends_gdn_to_the_scan_it_falls_back_to():
    """GDN's sm_70 row keeps its split for the HMMA.884 stages: the FMA pass turns their predicates off and leaves the
    row's fields, so chunk.py falls back to the scan as it does wherever no HMMA.884 stage applies."""
    from catengine.kernels.gdn import chunk
    from catengine.kernels.gdn.table import TABLE
    row = TABLE[70]
    assert row.prefill == "split" and row.h_hmma and row.o_hmma
    with reg.fma_path():
        assert TABLE[70] is row
        assert not chunk.h_hmma_applies(row, torch.float16, torch.device("cuda"))
        assert not chunk.o_hmma_applies(row, torch.float16, torch.device("cuda"))


def test_windowed_gdn_launches_count_their_share_of_the_per_token_tensors():
    from v100_record import TensorArg
    shape = {"B": 1, "L": 8192}     # 128 chunks of 64
    hb, ssm = TensorArg(torch.float16, 128 * 48 * 128 * 128 * 2, 1), TensorArg(torch.float32, 48 * 128 * 128 * 4, 2)
    w = TensorArg(torch.float16, 8192 * 48 * 128 * 2, 3)
    ln = _L("gdn_chunk_h_sm70_kernel", hb=hb, ssm=ssm, w=w, c_lo=16, c_hi=32)
    assert reg.dram_bytes(ln, shape) == pytest.approx((hb.nbytes + w.nbytes) / 8 + ssm.nbytes)
    ln = _L("gdn_chunk_o_sm70_kernel", hb=hb, w=w, c_lo=0)
    ln.grid = (32, 48, 2)           # no c_hi: the grid's first dim is the window's chunks
    assert reg.dram_bytes(ln, shape) == pytest.approx((hb.nbytes + w.nbytes) / 4)
