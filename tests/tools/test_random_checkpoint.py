"""Random-weight checkpoints (catengine.tools.random_checkpoint): configs of the presets, tiny dense/MoE checkpoints
(AWQ and unquantized) through the loader and the model, equality with `catengine quantize`, determinism, sizes."""
import hashlib
import json
import math

import pytest
import torch
import transformers
from safetensors import safe_open

from catengine.errors import ConfigError
from catengine.kernels.w4a16.packing import QuantizedWeight, dequantize
from catengine.models import ModelConfig, load_model
from catengine.models.batch import BatchMetadata
from catengine.models.loader import INDEX_FILE, iter_checkpoint, list_tensors, normalize_name
from catengine.tools.quantize import quantize_checkpoint, rtn_quantize
from catengine.tools.random_checkpoint import (PRESETS, build_config, estimate_checkpoint_bytes, main, make_tensor,
                                               tensor_specs, write_random_checkpoint)
from tests.models.helpers import PagedRunner

G = 32
TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
            head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, max_position_embeddings=4096)
MODELS = {
    "dense": dict(base="qwen3.5-27b", intermediate_size=96, **TINY),
    "moe": dict(base="qwen3.6-35b-a3b", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=32, **TINY),
}
CASES = [(m, q) for m in MODELS for q in ("awq", None)]
# H, layers, nh/nkv, Hk/Hv, FFN or (experts, top-k, Im, shared): the design notes (../shared/design/QWEN35.md),
# "Sizes"
TABLE = {
    "qwen3.5-27b": (5120, 64, 24, 4, 16, 48, 17408, None),
    "qwen3.6-35b-a3b": (2048, 40, 16, 2, 16, 32, 0, (256, 8, 512, 512)),
    "qwen3.5-122b-a10b": (3072, 48, 32, 2, 16, 64, 0, (256, 8, 1024, 1024)),
}


def write_kwargs(model, quant):
    # the sharded case: small shards, so the index path is the one tested
    shard = 64 << 10 if (model, quant) == ("moe", "awq") else 2 << 30
    return dict(quant=quant, group_size=G, mtp=True, seed=0, max_shard_bytes=shard, progress=False)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("random_ckpt")
    return {(m, q): write_random_checkpoint(root / f"{m}-{q}", MODELS[m], **write_kwargs(m, q)) for m, q in CASES}


def read_all(path) -> dict[str, torch.Tensor]:
    out = {}
    for info in list_tensors(path):
        with safe_open(str(info.file), framework="pt") as f:
            out[info.name] = f.get_tensor(info.name)
    return out


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_configs_match_table(preset, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(build_config(preset)))
    c = ModelConfig.from_pretrained(tmp_path)
    h, n, nh, nkv, hk, hv, ffn, moe = TABLE[preset]
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (h, n, nh, nkv)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (hk, hv)
    assert (c.head_dim, c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim) == (256, 128, 128, 4)
    assert (c.vocab_size, c.rope_theta, c.partial_rotary_factor, c.rotary_dim) == (248320, 1e7, 0.25, 64)
    assert c.max_position_embeddings == 262144 and not c.tie_word_embeddings and c.quant is None
    assert c.layer_types == tuple("full_attention" if i % 4 == 3 else "linear_attention" for i in range(n))
    if moe is None:
        assert c.architecture == "Qwen3_5ForConditionalGeneration" and c.intermediate_size == ffn and not c.is_moe
    else:
        assert c.architecture == "Qwen3_5MoeForConditionalGeneration"
        assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                c.shared_expert_intermediate_size) == moe
    # the transformers side of the benchmark reads the same file
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(hf).__name__ == ("Qwen3_5MoeConfig" if moe else "Qwen3_5Config")
    assert (hf.text_config.hidden_size, hf.text_config.num_hidden_layers) == (h, n)
    assert hf.text_config.layer_types == list(c.layer_types)
    # fewer layers keep the every-4th pattern
    assert ModelConfig.from_hf(build_config(preset, num_layers=6)).layer_types == c.layer_types[:6]


@pytest.mark.parametrize("model,quant", CASES)
def test_loads_and_runs(ckpts, model, quant):
    path = ckpts[(model, quant)]
    cfg = json.loads((path / "config.json").read_text())
    assert ("quantization_config" in cfg) == (quant is not None)
    assert (path / INDEX_FILE).is_file() == ((model, quant) == ("moe", "awq"))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (path / f).is_file()
    assert all(t.name.startswith(("model.language_model.", "lm_head.", "mtp.")) for t in list_tensors(path))
    m = load_model(path, torch.float32, "cpu", progress=False)
    assert m.mtp is not None
    runner = PagedRunner(m)
    prompt = [5, 17, 300, 2, 99, 41, 7, 8, 250, 3, 11, 64]
    first = runner.step({0: prompt})
    decode = torch.cat([runner.step({0: [t]}) for t in (12, 13)])
    other = runner.step({1: prompt[:-1] + [77]})
    for logits in (first, decode, other):
        assert torch.isfinite(logits).all()
    # the context reaches the logits: a different token at the end changes them
    assert (first - other).abs().max() > 0.1


@pytest.mark.parametrize("model", MODELS)
def test_transformers_reads_the_unquantized_checkpoint(ckpts, model):
    """The benchmark's transformers baseline loads the same files: no missing or unexpected text tensors."""
    path = ckpts[(model, None)]
    cls = transformers.Qwen3_5MoeForCausalLM if model == "moe" else transformers.Qwen3_5ForCausalLM
    hf, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    prompt = [5, 17, 300, 2, 99, 41, 7, 8]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, -1]
    ours = PagedRunner(load_model(path, torch.float32, "cpu", progress=False)).step({0: prompt})[0]
    assert (ref - ours).abs().max() < 1e-4


def expected_values(model, quant):
    """Normalized name -> what the loader must yield, recomputed from the specs (independent of the files)."""
    cfg = build_config(MODELS[model], mtp=True)
    out = {}
    for spec in tensor_specs(cfg["text_config"], mtp=True):
        name = normalize_name(spec.name)
        w = make_tensor(spec, 0)
        quant_here = quant is not None and not name.startswith("mtp.")  # the MTP head stays unquantized
        if quant_here and name.endswith(".mlp.experts.gate_up_proj"):
            half = w.shape[1] // 2
            qs = [[rtn_quantize(w[e, j * half:(j + 1) * half], G, False, torch.float16, torch.float16)
                   for j in (0, 1)] for e in range(w.shape[0])]
            out[name] = torch.stack([torch.cat([dequantize(q, torch.float32) for q in pair], -1) for pair in qs])
        elif quant_here and name.endswith(".mlp.experts.down_proj"):
            out[name] = torch.stack([dequantize(rtn_quantize(w[e], G, False, torch.float16, torch.float16),
                                                torch.float32) for e in range(w.shape[0])])
        elif quant_here and w.dim() == 2 and \
                not name.endswith(("in_proj_a.weight", "in_proj_b.weight", "mlp.gate.weight",
                                   "shared_expert_gate.weight", "embed_tokens.weight", "lm_head.weight")):
            out[name] = dequantize(rtn_quantize(w, G, False, torch.float16, torch.float16), torch.float32)
        else:
            out[name] = w.float()
    return out


@pytest.mark.parametrize("model,quant", CASES)
def test_loader_returns_the_written_values(ckpts, model, quant):
    path = ckpts[(model, quant)]
    expected = expected_values(model, quant)
    got = dict(iter_checkpoint(path, ModelConfig.from_pretrained(path), progress=False))
    assert set(got) == set(expected)
    n_quant = 0
    for name, value in got.items():
        if isinstance(value, QuantizedWeight):
            n_quant += 1
            value = dequantize(value, torch.float32)
        assert torch.equal(value.float(), expected[name]), name
    # every big linear of the layers is 4-bit: 3 GDN layers (qkv, z, out), 1 attention layer (q, k, v, o), 4 MLPs
    # (gate, up, down) or 4 MoE blocks (fused experts gate_up and down, shared expert gate, up, down)
    assert n_quant == ((3 * 3 + 4 + 4 * (3 if model == "dense" else 5)) if quant else 0)


@pytest.mark.parametrize("model", MODELS)
def test_awq_equals_quantize_of_the_fp16_checkpoint(ckpts, model, tmp_path):
    quantize_checkpoint(ckpts[(model, None)], tmp_path / "q", "awq", G, progress=False)
    ours, theirs = read_all(ckpts[(model, "awq")]), read_all(tmp_path / "q")
    assert set(ours) == set(theirs)
    for name, t in ours.items():
        assert t.dtype == theirs[name].dtype and torch.equal(t, theirs[name]), name
    cfg = lambda p: json.loads((p / "config.json").read_text())  # noqa: E731
    assert cfg(ckpts[(model, "awq")]) == cfg(tmp_path / "q")


def file_hashes(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_deterministic(ckpts, tmp_path):
    kw = write_kwargs("moe", "awq")
    again = write_random_checkpoint(tmp_path / "again", MODELS["moe"], **kw)
    assert file_hashes(again) == file_hashes(ckpts[("moe", "awq")])
    other = write_random_checkpoint(tmp_path / "other", MODELS["moe"], **{**kw, "seed": 1})
    differ = [n for n, h in file_hashes(other).items() if n.endswith(".safetensors") and h != file_hashes(again)[n]]
    assert len(differ) == len(list(other.glob("*.safetensors")))


@pytest.mark.parametrize("model,quant", CASES)
def test_estimate_matches_written_bytes(ckpts, model, quant):
    written = sum(t.nbytes for t in list_tensors(ckpts[(model, quant)]))
    assert estimate_checkpoint_bytes(MODELS[model], quant, group_size=G, mtp=True) == written


def test_estimate_of_the_presets():
    gib = 1 << 30
    awq27 = estimate_checkpoint_bytes("qwen3.5-27b", "awq")
    lm_and_embed = 2 * 248320 * 5120 * 2
    assert 15 * gib <= awq27 <= 17 * gib and awq27 > lm_and_embed
    # text-model parameter counts of the published models (vision tower excluded)
    assert 26.5e9 <= estimate_checkpoint_bytes("qwen3.5-27b", None) / 2 <= 27.5e9
    assert 34e9 <= estimate_checkpoint_bytes("qwen3.6-35b-a3b", None) / 2 <= 36e9
    assert 119e9 <= estimate_checkpoint_bytes("qwen3.5-122b-a10b", None) / 2 <= 123e9
    # layers scale linearly (8 and 64 layers have the same 3:1 mix); embed, lm_head and the final norm are fixed
    fixed = lm_and_embed + 5120 * 2
    assert awq27 - fixed == 8 * (estimate_checkpoint_bytes("qwen3.5-27b", "awq", num_layers=8) - fixed)


def test_weight_statistics(ckpts):
    """Residual stream stays O(1) and the layers carry a real share of it; fp16 inference matches fp32."""
    path = ckpts[("dense", None)]
    m = load_model(path, torch.float32, "cpu", progress=False)
    runner = PagedRunner(m)
    t = 24
    ids = torch.randint(0, 512, (t,), generator=torch.Generator().manual_seed(0))
    batch = BatchMetadata.build([t], [t], [list(range(t // runner.block_size))], runner.block_size, [0])
    pos = BatchMetadata.positions([t], [t])
    h, res = m.embed(ids), None
    emb = h.clone()
    for layer, cache in zip(m.layers, runner.caches.layers):
        h, res = layer(h, res, pos, batch, cache)
    rms = lambda x: x.pow(2).mean().sqrt().item()  # noqa: E731
    assert 0.9 < rms(emb) < 1.1
    assert 1.05 < rms(h + res) < 3.0 and rms(h + res - emb) > 0.3
    logits = {}
    for dtype in (torch.float32, torch.float16):
        logits[dtype] = PagedRunner(load_model(path, dtype, "cpu", progress=False)).step({0: ids.tolist()})
    assert torch.isfinite(logits[torch.float16]).all()
    # fp16 rounding of a few layers moves O(1) logits by ~1e-3; 0.05 would mean an overflow or a collapse
    assert (logits[torch.float16] - logits[torch.float32]).abs().max() < 0.05
    specs = tensor_specs(build_config(MODELS["dense"])["text_config"])
    spec = lambda suffix: next(s for s in specs if s.name.endswith(suffix))  # noqa: E731
    a = torch.exp(make_tensor(spec(".A_log"), 0, dtype=torch.float32))
    dt = torch.nn.functional.softplus(make_tensor(spec(".dt_bias"), 0, dtype=torch.float32))
    assert a.min() >= 1 and a.max() <= 16 and dt.min() >= 0.999e-3 and dt.max() <= 1.001e-1
    embed = make_tensor(spec("embed_tokens.weight"), 0, dtype=torch.float32)
    qkv = make_tensor(spec("in_proj_qkv.weight"), 0, dtype=torch.float32)
    assert abs(embed.std().item() - 1) < 0.02 and abs(qkv.std().item() * math.sqrt(64) - 1) < 0.05


def test_cli_and_errors(tmp_path, capsys):
    over = {k: v for k, v in MODELS["moe"].items() if k != "base"}
    args = [str(tmp_path / "m"), "--preset", "qwen3.6-35b-a3b", "--config-json", json.dumps(over), "--quant", "awq",
            "--group-size", str(G), "--layers", "2", "--seed", "3"]
    assert main(args) == 0
    c = ModelConfig.from_pretrained(tmp_path / "m")
    assert c.num_hidden_layers == 2 and c.num_experts == 4 and c.quant.method == "awq" and c.quant.group_size == G
    assert main(args) == 2 and "already holds a model" in capsys.readouterr().err
    assert main([str(tmp_path / "x"), "--preset", "qwen9"]) == 2 and "unknown preset" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="quant"):
        write_random_checkpoint(tmp_path / "y", "qwen3.5-27b", quant="gptq")
    with pytest.raises(ConfigError, match="intermediate_size"):
        build_config({"base": "qwen3.6-35b-a3b", "num_experts": 0})


@pytest.mark.gpu
def test_cuda_generation_is_deterministic_and_loads(tmp_path):
    kw = {**write_kwargs("moe", "awq"), "device": "cuda"}
    a = write_random_checkpoint(tmp_path / "a", MODELS["moe"], **kw)
    b = write_random_checkpoint(tmp_path / "b", MODELS["moe"], **kw)
    assert file_hashes(a) == file_hashes(b)
    logits = PagedRunner(load_model(a, torch.float16, "cuda", progress=False)).step({0: [1, 2, 3, 4, 5]})
    assert torch.isfinite(logits).all()
