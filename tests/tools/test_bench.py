"""`catengine bench` (catengine/cli/bench.py, tools/bench.py, tools/bench_common.py, tools/correctness.py): the TPS
formula, the roofline byte count, argument errors, checkpoint reuse, the in-memory transformers model, and a CPU
smoke run of every section."""
import json
import re
import math

import pytest
import torch

from catengine.tools.bench import SECTIONS, decode_weight_bytes, parse_sections, safetensors_sizes
from catengine.tools.bench_common import BENCH_PRESETS, checkpoint, incremental_tps
from catengine.cli import main
from catengine.errors import ConfigError


def test_incremental_tps_formula():
    # prefill + first token 0.5 s, 20 ms per further token: 63 tokens in 1.26 s -> 50 tok/s
    lat_64 = [0.5 + 63 * 0.02 + e for e in (0.003, -0.002, 0.0, 0.5)]   # an outlier: the median ignores it
    lat_1 = [0.5 + e for e in (0.001, 0.0, -0.001)]
    assert incremental_tps(lat_64, lat_1, 64) == pytest.approx(63 / (0.5 + 1.26 + 0.0015 - 0.5))
    assert incremental_tps([2.0], [1.0], 11) == pytest.approx(10.0)
    assert math.isnan(incremental_tps([1.0], [1.2], 64))   # noise above the decode time: no number, no crash
    with pytest.raises(ValueError, match="n >= 2"):
        incremental_tps([1.0], [0.5], 1)
    with pytest.raises(ValueError, match="at least one"):
        incremental_tps([], [0.5], 4)


def test_decode_weight_bytes_counts_routed_experts_at_top_k_share():
    sizes = {"model.language_model.embed_tokens.weight": 1000, "lm_head.weight": 1000, "mtp.fc.weight": 50,
             "model.language_model.layers.0.mlp.experts.3.gate_proj.qweight": 800,
             "model.language_model.layers.0.mlp.shared_expert.up_proj.qweight": 40,
             "model.language_model.layers.0.mlp.gate.weight": 8}
    assert decode_weight_bytes(sizes, num_experts=8, top_k=2) == 1000 + 200 + 40 + 8
    assert decode_weight_bytes({"lm_head.weight": 10, "a.mlp.experts.gate_up_proj": 10}) == 20


def test_sections_and_argument_errors(tmp_path, capsys):
    assert parse_sections("engine") == ["decode", "prefill", "concurrent", "roofline", "kv_fp8", "cuda_graphs"]
    assert parse_sections("cuda_graphs") == ["decode", "cuda_graphs"]
    assert parse_sections("all") == list(SECTIONS)
    assert parse_sections("roofline", correctness=True) == ["decode", "roofline", "correctness"]
    with pytest.raises(ConfigError, match="unknown section 'decod'"):
        parse_sections("decod")
    for argv, message in [(["--sections", "fast"], "unknown section 'fast'"),
                          (["--model-preset", "llama"], "unknown --model-preset 'llama'"),
                          (["--reps", "0"], "--reps must be >= 1"),
                          (["--sections", ","], "selected nothing")]:
        rc = main(["bench", "--device", "cpu", "--quick", "--workdir", str(tmp_path), *argv])
        assert rc == 2 and message in capsys.readouterr().out
    assert not any(tmp_path.iterdir())   # nothing was written before the arguments were checked


def test_checkpoint_is_reused_and_incomplete_one_rewritten(tmp_path):
    first = checkpoint(tmp_path, "tiny-dense", "awq", "cpu")
    stamp = (first / "config.json").stat().st_mtime_ns
    assert checkpoint(tmp_path, "tiny-dense", "awq", "cpu") == first
    assert (first / "config.json").stat().st_mtime_ns == stamp
    sizes = safetensors_sizes(first)
    assert "lm_head.weight" in sizes and any(n.endswith(".qweight") for n in sizes)
    assert sum(sizes.values()) <= sum(f.stat().st_size for f in first.glob("*.safetensors"))
    (first / "config.json").unlink()   # as if the write had been interrupted
    again = checkpoint(tmp_path, "tiny-dense", "awq", "cpu")
    assert (again / "config.json").exists() and safetensors_sizes(again) == sizes


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_in_memory_transformers_model_equals_the_checkpoint(tmp_path, kind):
    """The 27B baseline is built in memory on the GPU machine (no disk for 54 GB): same tensors as from_pretrained."""
    from catengine.tools.correctness import _hf_class, build_hf_in_memory
    spec = BENCH_PRESETS[f"tiny-{kind}"][0]
    path = checkpoint(tmp_path, f"tiny-{kind}", None, "cpu")
    ref = _hf_class(kind == "moe").from_pretrained(path, dtype=torch.float32)
    mem = build_hf_in_memory(spec, "cpu", torch.float32)
    got = dict(mem.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.equal(p, got[name]), name
    ids = torch.tensor([[1, 5, 9, 300, 7]])
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, mem(ids).logits)


def test_cpu_quick_run_of_every_section(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--device", "cpu", "--quick", "--sections", "all", "--model-preset", "tiny-dense",
               "--workdir", str(tmp_path / "w"), "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    # a noisy incremental TPS prints n/a, not nan; without graphs there is no graphs-vs-eager table
    assert re.search(r"\bnan\b", printed, re.I) is None and "graphs / eager" not in printed
    assert "CUDA graphs vs eager: skipped (no decode CUDA graphs on cpu)" in printed
    report = json.loads(out.read_text())
    assert report["sections"] == list(SECTIONS) and report["peers_vllm_0_25"]["qwen3.5-27b"]["prefill_8192"] == 12202
    r = report["models"]["tiny-dense"]
    assert set(r) == {"checkpoint", "decode_b1", "prefill", "concurrent", "roofline", "kv_fp8", "cuda_graphs",
                      "transformers"}
    assert r["cuda_graphs"]["graphs_used"] is False and "eager_tps" not in r["cuda_graphs"]  # graphs are CUDA-only
    assert set(r["decode_b1"]) == {"short", "long"} and r["decode_b1"]["long"]["ctx"] == 40
    assert list(r["prefill"]) == ["32"] and r["prefill"]["32"] > 0
    assert list(r["concurrent"]) == ["2"] and r["concurrent"]["2"] > 0
    roof = r["roofline"]
    assert roof["copy_bandwidth_gbs"] > 0
    for k in ("short", "long"):
        b = roof[k]["bytes"]
        assert b["total"] == b["weights"] + b["kv"] + b["gdn_state"] and min(b.values()) > 0
        assert roof[k]["roofline_tps"] > 0
    assert roof["long"]["bytes"]["kv"] == roof["short"]["bytes"]["kv"] * 40 // 16
    assert r["transformers"]["dtype"] == "float32"  # fp16 only on CUDA
    assert set(r["kv_fp8"]) == {"ctx", "fp16_tps", "fp8_e5m2_tps", "ratio"}
    mtp = report["mtp"]["runs"]   # the demo model's trained MTP head drafts; greedy tokens unchanged
    assert [m["k"] for m in mtp] == [1, 3] and all(m["same_tokens"] and m["tps"] > 0 for m in mtp)
    assert mtp[1]["mean_acceptance_length"] > 1.5
    assert r["transformers"]["transformers_fp16_tps"] is None or r["transformers"]["transformers_fp16_tps"] > 0
    q = report["quality"]["paths"]   # the trained demo model's held-out perplexity, CPU paths only
    assert set(q) == {"dense float32", "AWQ float32", "AWQ fp8 KV"} and all(p["ppl"] > 1 for p in q.values())
    assert q["dense float32"]["loss_minus_dense_fp32"] == 0.0
    for kind in ("dense", "moe"):
        c = report["correctness"][kind]
        assert c["tokens"] == 12 and set(c) == {"tokens", "catengine_fp16", "transformers_fp16", "pass"}
        # the float32 catengine model on CPU would agree exactly; fp16 must still be close on 12 tokens
        assert c["catengine_fp16"]["top1_agreement"] >= 0.9 and c["catengine_fp16"]["max_logprob_diff"] < 0.5
