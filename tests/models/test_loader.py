"""Checkpoint loading: both name layouts, sharding, fused and per-expert MoE weights, AWQ and compressed-tensors
checkpoints written by our quantizer, errors that name the offending tensors, and end-to-end logits."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from catengine.errors import ModelLoadError
from catengine.kernels.w4a16.packing import QuantizedWeight, dequantize
from catengine.models import ModelConfig, load_model
from catengine.models.batch import BatchMetadata
from catengine.models.loader import INDEX_FILE, checkpoint_names, iter_checkpoint
from catengine.models.quant_formats import matches_skip
from catengine.tools.quantize import quantize_checkpoint, rtn_quantize

from .helpers import build_hf_model

MULTIMODAL_ARCH = {False: "Qwen3_5ForConditionalGeneration", True: "Qwen3_5MoeForConditionalGeneration"}
# Linears the quantizer turns to 4 bits when the group size divides their input dimension (the design notes,
# ../shared/design/QWEN35.md)
QUANTIZED_SUFFIXES = ("in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight", "q_proj.weight", "k_proj.weight",
                      "v_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                      "experts.gate_up_proj", "experts.down_proj")


# ----------------------------------------------------------------------------- checkpoint builders
def save_checkpoint(d, tensors: dict, config: dict, shards: list[list[str]] | None = None):
    """Write ``tensors`` as one model.safetensors, or as the given shards with an index."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    if shards is None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"), {"format": "pt"})
        return d
    assert sorted(sum(shards, [])) == sorted(tensors)
    weight_map = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k].contiguous() for k in names}, str(d / fname), {"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def mtp_tensors(text: dict, cfg: dict) -> dict:
    """A complete MTP head: fc, its norms, and a copy of the last (full-attention) layer as mtp.layers.0."""
    h, last = cfg["hidden_size"], cfg["num_hidden_layers"] - 1
    g = torch.Generator().manual_seed(7)
    out = {"mtp.fc.weight": torch.randn(h, 2 * h, generator=g) * 0.05}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = torch.randn(h, generator=g) * 0.1
    prefix = f"model.layers.{last}."
    out.update({f"mtp.layers.0.{k[len(prefix):]}": v.clone() for k, v in text.items() if k.startswith(prefix)})
    return out


def multimodal_layout(d, text: dict, cfg: dict, moe: bool):
    """The published layout: model.language_model.*, a vision tower, an mtp.* shard, an index; the text
    tensors are split over two shards in the middle of layer 0 (through its experts for MoE)."""
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in text.items()}
    renamed["model.visual.blocks.0.attn.qkv.weight"] = torch.randn(24, 8)
    renamed["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2, 2)
    mtp = mtp_tensors(text, cfg)
    names = sorted(renamed)
    cut = names.index("model.language_model.layers.0.mlp.experts.3.down_proj.weight" if moe
                      else "model.language_model.layers.0.linear_attn.in_proj_z.weight")
    config = {"architectures": [MULTIMODAL_ARCH[moe]], "model_type": "qwen3_5_moe" if moe else "qwen3_5",
              "text_config": {**cfg, "mtp_num_hidden_layers": 1}, "vision_config": {"depth": 1},
              "tie_word_embeddings": cfg["tie_word_embeddings"]}
    return save_checkpoint(d, {**renamed, **mtp}, config, [names[:cut], names[cut:], sorted(mtp)])


def fused_layout(d, text: dict, cfg: dict):
    """Per-expert tensors replaced by fused [E, 2I, H] / [E, H, I] tensors, in one file."""
    out = {k: v for k, v in text.items() if ".mlp.experts." not in k}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts"
        e = range(cfg["num_experts"])
        out[f"{p}.gate_up_proj"] = torch.stack([torch.cat([text[f"{p}.{j}.gate_proj.weight"],
                                                           text[f"{p}.{j}.up_proj.weight"]]) for j in e])
        out[f"{p}.down_proj"] = torch.stack([text[f"{p}.{j}.down_proj.weight"] for j in e])
    return save_checkpoint(d, out, cfg)


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def source(request, tmp_path_factory):
    """(moe, hf model, text-layout dir, its tensors, its config dict) of a tiny float32 model."""
    moe = request.param
    hf = build_hf_model(moe=moe, seed=3)
    d = tmp_path_factory.mktemp("src") / "text"
    hf.save_pretrained(d)
    text = load_file(str(d / "model.safetensors"))
    return moe, hf, d, text, json.loads((d / "config.json").read_text())


def load(path, **kw):
    return dict(iter_checkpoint(path, ModelConfig.from_pretrained(path), progress=False, **kw))


# ----------------------------------------------------------------------------- layouts
def test_text_layout_yields_transformers_state_dict(source):
    moe, hf, d, _, _ = source
    got = load(d)
    want = hf.state_dict()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    if moe:
        assert not any(".experts.0." in k for k in got)


def test_all_layouts_yield_the_same_tensors(source, tmp_path):
    moe, _, d, text, cfg = source
    base = load(d)
    mm = load(multimodal_layout(tmp_path / "mm", text, cfg, moe))
    assert not any("visual" in k for k in mm)
    mtp = {k: v for k, v in mm.items() if k.startswith("mtp.")}
    assert {k: v for k, v in mm.items() if not k.startswith("mtp.")}.keys() == base.keys()
    for k, v in base.items():
        assert torch.equal(mm[k], v), k
    last = cfg["num_hidden_layers"] - 1
    assert "mtp.fc.weight" in mtp and "mtp.layers.0.self_attn.q_proj.weight" in mtp
    if moe:
        for which in ("gate_up_proj", "down_proj"):
            assert torch.equal(mtp[f"mtp.layers.0.mlp.experts.{which}"],
                               base[f"model.layers.{last}.mlp.experts.{which}"])
        fused = load(fused_layout(tmp_path / "fused", text, cfg))
        assert fused.keys() == base.keys()
        assert all(torch.equal(fused[k], v) for k, v in base.items())
        e, i, h = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
        assert base["model.layers.0.mlp.experts.gate_up_proj"].shape == (e, 2 * i, h)
        assert torch.equal(base["model.layers.0.mlp.experts.gate_up_proj"][5, i:],
                           text["model.layers.0.mlp.experts.5.up_proj.weight"])
        assert torch.equal(base["model.layers.0.mlp.experts.down_proj"][5],
                           text["model.layers.0.mlp.experts.5.down_proj.weight"])


def test_dtype_cast_and_names_from_headers(source, tmp_path):
    moe, _, d, text, cfg = source
    got = load(d, dtype=torch.bfloat16)
    assert all(v.dtype == torch.bfloat16 for v in got.values())
    assert got["model.layers.0.linear_attn.A_log"].dtype == torch.bfloat16
    mm = multimodal_layout(tmp_path / "mm", text, cfg, moe)
    names = checkpoint_names(mm, ModelConfig.from_pretrained(mm))
    assert names.keys() == load(mm).keys() and set(names.values()) == {"dense"}


def test_progress_line(source, capsys):
    _, _, d, _, _ = source
    load(d)
    assert capsys.readouterr().err == ""
    dict(iter_checkpoint(d, ModelConfig.from_pretrained(d), progress="always"))
    err = capsys.readouterr().err
    assert "model.safetensors (1/1)" in err and "GB (100%)" in err


# ----------------------------------------------------------------------------- quantized checkpoints
QUANT_CASES = [("awq", False, 32), ("compressed-tensors", True, 16), ("awq", True, 16),
               ("compressed-tensors", False, 64)]


def expected_quantized(name: str, w: torch.Tensor, group: int) -> bool:
    """Experts need both dimensions to divide (a layer's experts are one fused MoE elsewhere, one format)."""
    if not name.endswith(QUANTIZED_SUFFIXES) or ".shared_expert_gate" in name:
        return False
    if ".experts." in name:
        return w.shape[-1] % group == 0 and (w.shape[-2] // (2 if name.endswith("gate_up_proj") else 1)) % group == 0
    return w.shape[-1] % group == 0


def rtn_dequant(name: str, w: torch.Tensor, group: int, sym: bool, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """RTN of one normalized tensor in the loader's x @ w layout: (dequantized values, per-element scale)."""
    sd = torch.float16 if fmt == "awq" else w.dtype

    def one(m):
        qw = rtn_quantize(m, group, sym, sd)
        return dequantize(qw, torch.float32), qw.scales.float().repeat_interleave(group, 0)

    if w.dim() == 2:
        return one(w)
    if name.endswith("gate_up_proj"):
        i = w.shape[1] // 2
        pairs = [[one(e[:i]), one(e[i:])] for e in w]
        return (torch.stack([torch.cat([g[0], u[0]], -1) for g, u in pairs]),
                torch.stack([torch.cat([g[1], u[1]], -1) for g, u in pairs]))
    pairs = [one(e) for e in w]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


@pytest.mark.parametrize("fmt,sym,group", QUANT_CASES,
                         ids=[f"{f}-{'sym' if s else 'asym'}-g{g}" for f, s, g in QUANT_CASES])
def test_quantized_checkpoint_yields_rtn_values(source, tmp_path, fmt, sym, group):
    moe, _, d, text, cfg = source
    dense = load(d)
    q = quantize_checkpoint(d, tmp_path / "q", fmt, group, sym, progress=False)
    got = load(q)
    assert got.keys() == dense.keys()
    n_quant = 0
    for name, w in dense.items():
        v = got[name]
        if not expected_quantized(name, w, group):
            assert isinstance(v, torch.Tensor) and torch.equal(v, w), name
            continue
        n_quant += 1
        assert isinstance(v, QuantizedWeight), name
        assert v.qweight.shape[:-2] == w.shape[:-2] and (v.in_features, v.out_features) == (w.shape[-1], w.shape[-2])
        want, scale = rtn_dequant(name, w, group, sym, fmt)
        deq = dequantize(v, torch.float32)
        assert torch.equal(deq, want), name
        # independent of rtn_quantize: round-to-nearest is within half a step
        assert ((deq - w.transpose(-1, -2)).abs() <= scale * (0.5 + 1e-6)).all(), name
    assert n_quant >= (9 if moe and group < 64 else 8)
    cfg_q = ModelConfig.from_pretrained(q).quant
    assert cfg_q.method == fmt and cfg_q.group_size == group and cfg_q.symmetric == (sym and fmt != "awq")
    names = checkpoint_names(q, ModelConfig.from_pretrained(q))
    assert names == {k: "quantized" if isinstance(v, QuantizedWeight) else "dense" for k, v in got.items()}
    # the skip list other engines read names every unquantized linear (fused experts by their layer) and no other
    for name, v in got.items():
        module = name[: -len(".weight")] if name.endswith(".weight") else name
        if isinstance(v, QuantizedWeight) or v.dim() >= 2:
            assert matches_skip(module, cfg_q.skip, fmt) != isinstance(v, QuantizedWeight), name


def test_quantized_multimodal_layout_matches_text_layout(source, tmp_path):
    moe, _, d, text, cfg = source
    mm = multimodal_layout(tmp_path / "mm", text, cfg, moe)
    a = load(quantize_checkpoint(d, tmp_path / "qa", "awq", 32, progress=False))
    b = load(quantize_checkpoint(mm, tmp_path / "qb", "awq", 32, progress=False), dtype=torch.float32)
    assert b.keys() == a.keys() | {k for k in b if k.startswith("mtp.")}
    assert all(isinstance(v, torch.Tensor) for k, v in b.items() if k.startswith("mtp."))  # mtp stays dense
    for k, v in a.items():
        if isinstance(v, QuantizedWeight):
            assert torch.equal(b[k].qweight, v.qweight) and torch.equal(b[k].zeros, v.zeros.float()), k
            assert torch.equal(b[k].scales, v.scales.float()), k
        else:
            assert torch.equal(b[k], v), k
    names = checkpoint_names(tmp_path / "qb", ModelConfig.from_pretrained(tmp_path / "qb"))
    assert names.keys() == b.keys()
    assert all((names[k] == "quantized") == isinstance(v, QuantizedWeight) for k, v in b.items())


# ----------------------------------------------------------------------------- errors
def test_errors_name_the_offending_tensors(source, tmp_path):
    moe, _, d, text, cfg = source
    mm = multimodal_layout(tmp_path / "mm", text, cfg, moe)
    conf = ModelConfig.from_pretrained(mm)
    index = json.loads((mm / INDEX_FILE).read_text())

    index["weight_map"]["model.language_model.layers.0.ghost.weight"] = "model-00003-of-00003.safetensors"
    (mm / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"layers\.0\.ghost\.weight \(in model-00003-of-00003"):
        list(iter_checkpoint(mm, conf, progress=False))

    (mm / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model-00003-of-00003.safetensors.*mtp\.fc\.weight"):
        list(iter_checkpoint(mm, conf, progress=False))

    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        list(iter_checkpoint(tmp_path, conf, progress=False))


def test_quantized_errors(source, tmp_path):
    moe, _, d, text, cfg = source
    q = quantize_checkpoint(d, tmp_path / "q", "awq", 32, progress=False)
    conf = ModelConfig.from_pretrained(q)
    tensors = load_file(str(q / "model.safetensors"))
    raw_cfg = json.loads((q / "config.json").read_text())

    broken = dict(tensors)
    del broken["model.layers.0.linear_attn.in_proj_z.qzeros"]
    save_checkpoint(tmp_path / "b1", broken, raw_cfg)
    with pytest.raises(ModelLoadError, match=r"lacks tensors model\.layers\.0\.linear_attn\.in_proj_z\.qzeros"):
        list(iter_checkpoint(tmp_path / "b1", conf, progress=False))

    nvfp4 = dict(tensors)
    nvfp4["model.layers.0.linear_attn.in_proj_z.weight_scale_2"] = torch.ones(1)
    save_checkpoint(tmp_path / "b2", nvfp4, raw_cfg)
    with pytest.raises(ModelLoadError, match=r"in_proj_z\.weight_scale_2"):
        list(iter_checkpoint(tmp_path / "b2", conf, progress=False))

    fp8 = {k: v for k, v in text.items()}
    fp8["model.layers.0.linear_attn.in_proj_z.weight"] = fp8["model.layers.0.linear_attn.in_proj_z.weight"].to(
        torch.float8_e4m3fn)
    fp8["model.layers.0.linear_attn.in_proj_z.weight_scale"] = torch.ones(1)
    save_checkpoint(tmp_path / "b3", fp8, cfg)
    with pytest.raises(ModelLoadError, match=r"FP8.*in_proj_z\.weight"):
        list(iter_checkpoint(tmp_path / "b3", ModelConfig.from_hf(cfg), progress=False))

    if moe:
        # experts whose down projections are dense while gate/up are quantized: two stacks of different formats
        down = "model.layers.1.mlp.experts.{}.down_proj"
        mixed = {k: v for k, v in tensors.items() if not any(k.startswith(down.format(e) + ".") for e in range(8))}
        mixed.update({down.format(e) + ".weight": text[down.format(e) + ".weight"] for e in range(8)})
        save_checkpoint(tmp_path / "m", mixed, raw_cfg)
        got = dict(iter_checkpoint(tmp_path / "m", conf, progress=False))
        assert isinstance(got["model.layers.1.mlp.experts.gate_up_proj"], QuantizedWeight)
        assert torch.equal(got["model.layers.1.mlp.experts.down_proj"][3], text[down.format(3) + ".weight"])
        assert checkpoint_names(tmp_path / "m", conf)["model.layers.1.mlp.experts.down_proj"] == "dense"
        del mixed[down.format(5) + ".weight"]
        mixed.update({f"{down.format(5)}.{p}": tensors[f"{down.format(5)}.{p}"]
                      for p in ("qweight", "qzeros", "scales")})
        save_checkpoint(tmp_path / "m2", mixed, raw_cfg)
        with pytest.raises(ModelLoadError, match=r"experts\.down_proj: some experts are quantized and some are dense "
                                                 r"\(model\.layers\.1\.mlp\.experts\.0\.down_proj"):
            list(iter_checkpoint(tmp_path / "m2", conf, progress=False))

        gone = {k: v for k, v in text.items() if k != "model.layers.2.mlp.experts.6.up_proj.weight"}
        save_checkpoint(tmp_path / "b4", gone, cfg)
        with pytest.raises(ModelLoadError, match=r"missing model\.layers\.2\.mlp\.experts\.6\.up_proj"):
            list(iter_checkpoint(tmp_path / "b4", ModelConfig.from_hf(cfg), progress=False))


# ----------------------------------------------------------------------------- end to end
def prefill_logits(model, ids: list[int]) -> torch.Tensor:
    caches = model.allocate_caches(32, 4, 2)
    qlens = slens = [len(ids)]
    batch = BatchMetadata.build(qlens, slens, [list(range((len(ids) + 3) // 4))], 4, [0])
    hidden = model(torch.tensor(ids), BatchMetadata.positions(qlens, slens), batch, caches)
    return model.compute_logits(hidden)


IDS = torch.randint(0, 512, (21,), generator=torch.Generator().manual_seed(5)).tolist()


def test_layouts_give_identical_logits(source, tmp_path):
    moe, hf, d, text, cfg = source
    want = prefill_logits(load_model(d, progress=False), IDS)
    with torch.no_grad():
        assert (want - hf(torch.tensor([IDS])).logits[0]).abs().max() <= 1e-4
    mm = load_model(multimodal_layout(tmp_path / "mm", text, cfg, moe), progress=False)
    assert mm.mtp is not None
    assert torch.equal(prefill_logits(mm, IDS), want)
    if moe:
        assert torch.equal(prefill_logits(load_model(fused_layout(tmp_path / "f", text, cfg), progress=False), IDS),
                           want)


@pytest.mark.parametrize("fmt,sym,group", [("awq", False, 32), ("compressed-tensors", True, 64)])
def test_quantized_logits_equal_dequantized_model(source, tmp_path, fmt, sym, group):
    moe, hf, d, _, _ = source
    q = quantize_checkpoint(d, tmp_path / "q", fmt, group, sym, progress=False)
    ours = prefill_logits(load_model(q, torch.float32, progress=False), IDS)
    deq = {k: (dequantize(v, torch.float32).transpose(-1, -2) if isinstance(v, QuantizedWeight) else v)
           for k, v in load(q).items()}
    assert any(isinstance(v, QuantizedWeight) for v in load(q).values())
    oracle = build_hf_model(moe=moe, seed=3)
    oracle.load_state_dict(deq, strict=True)
    with torch.no_grad():
        want = oracle(torch.tensor([IDS])).logits[0]
    assert (ours - want).abs().max() <= 1e-4
