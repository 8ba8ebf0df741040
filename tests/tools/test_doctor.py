"""`catengine doctor` on this CPU machine, and on machines it is not (torch's facts monkeypatched): a V100 with a
CUDA-13 torch, a V100 whose Triton cannot build sm_70, the sm_70 path with and without an HMMA.884 kernel."""
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


def test_v100_with_a_torch_that_has_sm70_is_fine_and_says_fma(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch, "Tesla V100-SXM2-32GB", 70, CUDA128_ARCHES, cuda="12.8")
    facts = doctor.gather_facts(probe=False)
    facts["triton"] = {"version": "3.5.1", "ptxas_sm70": {"ok": True, "detail": "compiled a kernel for sm_70"}}
    for family in ("w4a16", "moe", "attention", "gdn", "norm", "sampling"):
        (tmp_path / family).mkdir()
    report = doctor.build_report(facts, kernels_dir=tmp_path)
    assert report["ok"], report["problems"]
    paths = {op: v["path"] for op, v in report["ops"].items()}
    for op in doctor.MATMUL_OPS:
        assert paths[op].startswith("tl.dot -> FMA"), (op, paths[op])
    assert paths["rms_norm"] == "Triton (no matrix product)"
    assert "from M = 1024: dequantise + cuBLAS" in paths["w4a16_linear"]
    # an sm_70 kernel lands in a family: that family's op reports the HMMA.884 path, the others stay FMA
    (tmp_path / "w4a16" / "gemm_sm70.py").write_text("")
    (tmp_path / "moe" / "grouped.py").write_text("from ..common.mma884 import mma884\n")
    paths = {op: v["path"] for op, v in doctor.build_report(facts, kernels_dir=tmp_path)["ops"].items()}
    assert paths["w4a16_linear"].startswith("HMMA.884 Gluon") and paths["fused_moe"] == "HMMA.884 Gluon"
    assert paths["paged_attention"].startswith("tl.dot -> FMA")
    facts["triton"]["version"] = "3.2.0"   # the last Triton that lowered tl.dot to Volta tensor cores
    assert doctor.build_report(facts, kernels_dir=tmp_path)["ops"]["paged_attention"]["path"].startswith(
        "tl.dot (HMMA via Triton < 3.3)")


def test_h200_rows_and_the_switch(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch, "NVIDIA H200", 90, CUDA13_ARCHES)
    facts = doctor.gather_facts(probe=False)
    facts["triton"] = {"version": "3.6.0", "ptxas_sm70": {"ok": False, "detail": "ptxas fatal"}}
    report = doctor.build_report(facts, kernels_dir=tmp_path)
    assert report["ok"], report["problems"]          # no sm_70 build is needed on an H200 without the switch
    assert report["ops"]["fused_moe"]["path"] == "tl.dot (tensor cores)"
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "70")
    facts = {**doctor.gather_facts(probe=False), "triton": facts["triton"]}
    report = doctor.build_report(facts, kernels_dir=tmp_path)
    assert report["ops"]["fused_moe"]["path"].startswith("tl.dot -> FMA")
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
