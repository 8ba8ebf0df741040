"""`catengine doctor` on this CPU machine, and on machines it is not (torch's facts monkeypatched): a V100 with a
CUDA-13 torch, a V100 whose Triton cannot build sm_70, the path each op takes on the sm_70 row as its tables say."""
import io
import json
from types import SimpleNamespace

import pytest
import torch

from catengine.cli import main
from catengine.kernels import ops
from catengine.kernels.common import arch
from catengine.tools import doctor

CUDA13_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]   # torch 2.11+cu130 on the H200
CUDA128_ARCHES = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def test_on_this_cpu_machine_says_no_gpu_and_twins_everywhere(monkeypatch, capsys):
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "")
    monkeypatch.delenv("CATENGINE_KERNELS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main(["doctor"])      # with the sm_70 compile probe: Triton's ptxas builds sm_70 here (tests/kernels/test_aot.py)
    text = capsys.readouterr().out
    assert "GPU: none visible to torch" in text and "ptxas for sm_70: yes" in text
    assert rc == 0 and "no problems found" in text
    report = doctor.build_report(doctor.gather_facts(probe=False))
    assert set(report["ops"]) == set(ops.REGISTRY.names())
    assert {v["path"] for v in report["ops"].values()} == {"torch twin"}
    assert report["ok"] and report["problems"] == []


def test_json_output_parses(monkeypatch, capsys):
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "")
    assert main(["doctor", "--json", "--no-compile"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert {"gpus", "torch", "triton", "ops", "problems", "ok"} <= set(report)
    assert report["ok"] == (report["problems"] == [])


def _fake_gpu(monkeypatch, name: str, cc: int, arch_list: list[str], cuda: str = "13.0"):
    props = SimpleNamespace(name=name, major=cc // 10, minor=cc % 10, multi_processor_count=80,
                            total_memory=32 << 30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arch_list))
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "")
    monkeypatch.delenv("CATENGINE_KERNELS", raising=False)


def test_v100_with_a_cuda13_torch_gets_the_problem_and_its_fix(monkeypatch):
    _fake_gpu(monkeypatch, "Tesla V100-SXM2-32GB", 70, CUDA13_ARCHES)
    facts = doctor.gather_facts(probe=False)
    assert facts["gpus"][0]["cc"] == 70
    report = doctor.build_report(facts)
    assert not report["ok"] and len(report["problems"]) == 1
    p = report["problems"][0]
    assert "sm_70" in p["problem"] and "no kernels" in p["problem"]
    assert p["fix"].startswith("pip install torch==2.9.1 --index-url https://download.pytorch.org/whl/cu128")
    text = doctor.format_report(report)
    assert "sm_70: no" in text and "fix: pip install torch==2.9.1" in text
    monkeypatch.setattr(doctor, "gather_facts", lambda probe=True: facts)
    out = io.StringIO()
    assert doctor.run_doctor(file=out) == 1 and "1 problem(s)" in out.getvalue()


def test_v100_with_a_torch_that_has_sm70_is_fine_and_says_which_path_runs(monkeypatch):
    """The paths follow the sm_70 row's tables and switches (what the dispatch reads), not which files exist:
    turning a family's HMMA.884 choice off on the row turns its report to FMA."""
    import dataclasses
    from catengine.kernels.attention import paged_sm70
    from catengine.kernels.gdn import table as gdn_table
    from catengine.kernels.moe import fused as moe_fused
    from catengine.kernels.w4a16 import gemm as w4a16_gemm
    _fake_gpu(monkeypatch, "Tesla V100-SXM2-32GB", 70, CUDA128_ARCHES, cuda="12.8")
    facts = doctor.gather_facts(probe=False)
    facts["triton"] = {"version": "3.5.1", "ptxas_sm70": {"ok": True, "detail": "compiled a kernel for sm_70"}}
    report = doctor.build_report(facts)
    assert report["ok"], report["problems"]

    def paths():
        return {op: v["path"] for op, v in doctor.build_report(facts)["ops"].items()}

    p = paths()
    assert p["rms_norm"] == "Triton (no matrix product)"
    assert p["skinny_linear"] == "cuBLAS (F.linear; the row has no skinny table)"
    assert p["skinny_counters"] == "host only (no kernel)"
    assert p["w4a16_linear"] == ("M <= 1: GEMV on CUDA cores; M 2-1023: HMMA.884 Gluon (fp16, "
                                 "groups 32/64/128; else tl.dot -> FMA); from M = 1024: dequantise + cuBLAS")
    assert p["fused_moe"].endswith("above: HMMA.884 Gluon (fp16 W4A16 experts, groups 32/64/128; else tl.dot -> FMA)")
    monkeypatch.setattr(paged_sm70, "ENABLED", False)
    assert paths()["paged_attention"].startswith("tl.dot -> FMA (its HMMA.884 kernel is off")
    monkeypatch.setattr(paged_sm70, "ENABLED", True)
    assert paths()["paged_attention"].startswith("HMMA.884 Gluon (fp16 queries, fp16 or e5m2 cache, head dims 64/128/256")
    row = gdn_table.TABLE[70]
    monkeypatch.setitem(gdn_table.TABLE, 70, dataclasses.replace(row, prefill="scan"))
    assert paths()["chunk_gated_delta_rule"].startswith("tl.dot -> FMA (the row runs the scan form")
    monkeypatch.setitem(gdn_table.TABLE, 70, dataclasses.replace(row, prefill="split"))
    assert paths()["chunk_gated_delta_rule"] == ("split form: WY HMMA.884 Gluon (fp16); state HMMA.884 Gluon (fp16); "
                                                 "output HMMA.884 Gluon (fp16)")
    # the row's HMMA.884 choices off: every matrix product is FMA again
    monkeypatch.setitem(w4a16_gemm.TABLES, "sm70", dataclasses.replace(w4a16_gemm.TABLES["sm70"], hmma_min_m=None))
    monkeypatch.setitem(moe_fused.TABLES, "sm70", dataclasses.replace(moe_fused.TABLES["sm70"], hmma=False))
    monkeypatch.setitem(gdn_table.TABLE, 70, dataclasses.replace(row, prefill="split", o_hmma=False, h_hmma=False,
                                                                      wy_hmma=False))
    monkeypatch.setattr(paged_sm70, "ENABLED", False)
    p = paths()
    assert not any("HMMA.884 Gluon" in p[op] for op in doctor.MATMUL_OPS), p
    assert p["w4a16_linear"] == "M <= 1: GEMV on CUDA cores; M 2-1023: tl.dot -> FMA; from M = 1024: dequantise + cuBLAS"
    assert "tl.dot -> FMA: Triton >= 3.3 lowers tl.dot to fp32 FMA" in doctor.format_report(doctor.build_report(facts))
    facts["triton"]["version"] = "3.2.0"   # the last Triton that lowered tl.dot to Volta tensor cores
    assert paths()["paged_attention"].startswith("tl.dot (HMMA via Triton < 3.3)")


def test_h200_rows_and_the_switch(monkeypatch):
    _fake_gpu(monkeypatch, "NVIDIA H200", 90, CUDA13_ARCHES)
    facts = doctor.gather_facts(probe=False)
    facts["triton"] = {"version": "3.6.0", "ptxas_sm70": {"ok": False, "detail": "ptxas fatal"}}
    report = doctor.build_report(facts)
    assert report["ok"], report["problems"]          # no sm_70 build is needed on an H200 without the switch
    assert report["ops"]["fused_moe"]["path"].endswith("up to 2048: mma.sync m16n8k16 Gluon (fp16 W4A16 experts, "
                                                        "groups 32/64/128; else tl.dot (tensor cores)); above: tl.dot "
                                                        "(tensor cores)")
    assert report["ops"]["w4a16_linear"]["path"].startswith("M <= 2: GEMV on CUDA cores; M 3-13: mma.sync m16n8k16 "
                                                            "Gluon (fp16, groups 32/64/128; else tl.dot (tensor cores); "
                                                            "M 8-13: wgmma where its pick splits K); "
                                                            "M 14-64: wgmma Gluon (fp16, groups 32/64/128, N % 16 == 0; "
                                                            "else tl.dot (tensor cores)); M 65-255: tl.dot (tensor cores)")
    assert report["ops"]["paged_attention"]["path"] == "tl.dot (tensor cores)"
    assert report["ops"]["skinny_linear"]["path"] == ("fp16/bf16, M <= 32, N <= 512, K >= 384: tl.dot (tensor cores), "
                                                      "split K reduced in-kernel (one launch); else cuBLAS (F.linear)")
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "70")
    facts = {**doctor.gather_facts(probe=False), "triton": facts["triton"]}
    report = doctor.build_report(facts)
    assert "above: HMMA.884 Gluon" in report["ops"]["fused_moe"]["path"]
    assert [p["problem"] for p in report["problems"]] == ["Triton 3.6.0's ptxas cannot build for sm_70 (ptxas fatal)"]
    assert "TRITON_PTXAS_PATH" in report["problems"][0]["fix"]


def test_invalid_switch_is_a_problem(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "75")
    report = doctor.build_report(doctor.gather_facts(probe=False))
    assert not report["ok"] and "70, 80, 90" in report["problems"][0]["problem"]
    assert report["problems"][0]["fix"] == "unset CATENGINE_ARCH, or set it to 70, 80 or 90"


@pytest.mark.parametrize("arch_list,cc,ok", [
    (CUDA13_ARCHES, 70, False), (CUDA128_ARCHES, 70, True), (["sm_70"], 75, True), (["compute_70"], 75, True),
    (["sm_80"], 86, True), (["sm_90"], 80, False), (["sm_75", "compute_75"], 70, False), ([], 90, False),
])
def test_torch_runs_on(arch_list, cc, ok):
    assert doctor.torch_runs_on(arch_list, cc) is ok
