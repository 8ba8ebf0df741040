"""Tokenizer wrapper, chat templates and the incremental detokenizer (UTF-8 safety, stop strings).

Three tokenizers: the demo model's (the real Qwen3.5 vocabulary), a tiny byte-level BPE and a tiny
SentencePiece-style BPE with byte fallback (``<0xNN>`` tokens), both trained here in milliseconds.
"""
import json
import string

import pytest

from catengine.errors import ConfigError, InvalidRequest, ModelLoadError
from catengine.sampling import SamplingParams
from catengine.tokenizer import PROMPT_CONTEXT_TOKENS, IncrementalDetokenizer, Tokenizer, _gpt2_byte_decoder

# No "-" whitespace control: the pieces are concatenated without source whitespace to trim.
TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' ~ m.role) }}{% endif %}"
    "<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{% for k, v in c.function.arguments | items %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)
TEXTS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "猫は可愛い。世界 龘 𠜎 and 한국어 text",
    "emoji 🐱🐈\u200d⬛ 👩\u200d👩\u200d👧 done 🙂",
    "mixed: é ß ñ — “quotes” ½ end\ttab\nnew  line",
]


def _write_dir(path, tok, config, generation=None):
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def _build_byte_level(path):
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as RawTokenizer
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator([" ".join(TEXTS[:1] + ["STOP the answer is 42 ### done"])] * 20, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ("<tool_call>", "</tool_call>", "<think>", "</think>")])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "clean_up_tokenization_spaces": False, "chat_template": TEMPLATE}
    return _write_dir(path, tok, config, {"eos_token_id": tok.token_to_id("<|endoftext|>"), "temperature": 0.5})


def _build_byte_fallback(path):
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as RawTokenizer
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for c in "▁" + string.ascii_letters + string.digits + string.punctuation:
        vocab.setdefault(c, len(vocab))
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("l", "l"), ("o", "r"), ("▁", "a"), ("#", "#")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = RawTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "chat_template": TEMPLATE}
    return _write_dir(path, tok, config)


@pytest.fixture(scope="session")
def demo_dir():
    # tests/conftest.py points CATENGINE_CACHE at a per-session folder: one demo build for the whole run
    from catengine.tools import demo
    return demo.demo_model_path()


@pytest.fixture(scope="session")
def tokenizers(tmp_path_factory, demo_dir):
    root = tmp_path_factory.mktemp("tokenizers")
    return {"demo": Tokenizer(demo_dir),
            "byte_level": Tokenizer(_build_byte_level(root / "byte_level")),
            "byte_fallback": Tokenizer(_build_byte_fallback(root / "byte_fallback"))}


# special token (dropped by skip_special_tokens) and a markup token (kept) of each tokenizer
MARKUP = {"demo": ("<|im_start|>", "<tool_call>"), "byte_level": ("<|im_start|>", "<tool_call>"),
          "byte_fallback": ("<s>", "<tool_call>")}


@pytest.fixture(params=sorted(MARKUP))
def tok(request, tokenizers):
    tokenizer = tokenizers[request.param]
    tokenizer.name = request.param
    return tokenizer


def stream(tokenizer, ids, prompt=(), visible=False, **params):
    detok = IncrementalDetokenizer(tokenizer, list(prompt), SamplingParams(**params), special_tokens_visible=visible)
    deltas = [detok.add(i) for i in ids]
    return detok, deltas, detok.flush()


# ------------------------------------------------------------------ Tokenizer
def test_tokenizer_attributes(tokenizers):
    demo = tokenizers["demo"]
    assert demo.eos_token_ids == (248044, 248046) and demo.vocab_size == 248077
    assert demo.generation_config["top_k"] == 20
    assert demo.encode("hi")[0] != 248044, "no BOS for Qwen"
    small = tokenizers["byte_level"]
    endoftext, im_end = small.hf.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert small.eos_token_ids == tuple(sorted((endoftext, im_end)))   # generation_config united with EOS
    assert small.vocab_size == len(small.hf) and small.generation_config == {"eos_token_id": endoftext,
                                                                              "temperature": 0.5}
    assert tokenizers["byte_fallback"].generation_config == {}
    assert tokenizers["byte_fallback"].eos_token_ids == (2,)
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer("/nonexistent/model")
    with pytest.raises(InvalidRequest, match="prompt must be a string"):
        small.encode(["not", "text"])


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_and_token_bytes(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


# ------------------------------------------------------------------ detokenizer: UTF-8
def test_streamed_equals_decode_and_never_broken(tok):
    split_chars = 0
    for text in TEXTS:
        ids = tok.encode(text)
        split_chars += sum("\ufffd" in tok.token_text(i) for i in ids)
        for prompt in ([], tok.encode("prompt context: 🐱")):
            detok, deltas, tail = stream(tok, ids, prompt)
            assert not any("\ufffd" in d for d in deltas), deltas
            assert "".join(deltas) == text and tail == "" and detok.text == text
    assert split_chars > 0, "the texts must contain characters split across tokens"


def test_incomplete_character_is_held_until_flush(tok):
    ids = tok.encode("ok 🐱")
    head = ids[:-1]   # the cat's last byte is missing
    assert "\ufffd" in tok.decode(head)
    detok, deltas, tail = stream(tok, head)
    emitted = "".join(deltas)   # the space may share a token with the cat's first bytes
    assert emitted in ("ok", "ok ") and "\ufffd" not in emitted
    assert "".join(deltas) + tail == detok.text == tok.decode(head)
    assert detok.flush() == "", "flush is idempotent"


def _byte_token(tok, byte):
    if tok.name == "byte_fallback":
        return tok.hf.convert_tokens_to_ids(f"<0x{byte:02X}>")
    char = {b: c for c, b in _gpt2_byte_decoder().items()}[byte]
    return tok.hf.convert_tokens_to_ids(char)


def test_invalid_bytes_are_released_not_held_forever(tok, monkeypatch):
    garbage = _byte_token(tok, 0x90)   # a lone continuation byte never completes a character
    assert tok.token_bytes(garbage) == b"\x90"
    ids = tok.encode("ok") + [garbage] * 40 + tok.encode(" 🐱")
    seen = []
    decode = tok.decode
    monkeypatch.setattr(tok, "decode", lambda ids, skip_special_tokens=True: seen.append(len(ids)) or
                        decode(ids, skip_special_tokens))
    detok, deltas, tail = stream(tok, ids)
    assert "".join(deltas) + tail == detok.text == decode(ids)
    assert sum(len(d) for d in deltas[:30]) > 10, "garbage bytes are released, not held to the end"
    assert max(seen) <= PROMPT_CONTEXT_TOKENS + 10 and deltas[-1].endswith("🐱") and tail == ""


def test_decoding_window_is_constant_size(tok, monkeypatch):
    seen = []
    decode = tok.decode
    monkeypatch.setattr(tok, "decode", lambda ids, skip_special_tokens=True: seen.append(len(ids)) or
                        decode(ids, skip_special_tokens))
    ids = tok.encode(" ".join(TEXTS) * 4)
    detok, deltas, tail = stream(tok, ids, prompt=list(range(50, 90)))
    assert "".join(deltas) + tail == decode(ids) and len(ids) > 150
    assert max(seen) <= PROMPT_CONTEXT_TOKENS + 5, max(seen)


# ------------------------------------------------------------------ detokenizer: stop strings
def _boundary_stop(tok, text, near):
    """A 4-character stop string around the token boundary nearest ``near`` that no single token holds."""
    ids = tok.encode(text)
    ends = [len(tok.decode(ids[:k + 1])) for k in range(len(ids))]
    pos = min((e for e in ends[:-1] if 2 <= e <= len(text) - 2), key=lambda e: abs(e - near))
    stop = text[pos - 2:pos + 2]
    assert not any(stop in tok.token_text(i) for i in ids)
    return stop


def _check_stop(tok, text, stops, expected, **params):
    detok, deltas, tail = stream(tok, tok.encode(text), stop=stops, **params)
    emitted = ""
    for delta in deltas:
        emitted += delta
        assert expected.startswith(emitted), (emitted, expected)   # no part of a stop ever leaks
    assert emitted + tail == detok.text == expected
    return detok


def test_stop_string_split_across_tokens(tok):
    text = "The answer is 42, then more text ### and a 🐱! tail"
    for near in (8, 20, 30):
        stop = _boundary_stop(tok, text, near)
        detok = _check_stop(tok, text, [stop], text[:text.index(stop)])
        assert detok.finished and detok.stop_reason == stop
    # a stop string made of multi-byte characters split into several byte tokens
    detok = _check_stop(tok, text, ["🐱!"], "The answer is 42, then more text ### and a ")
    assert detok.stop_reason == "🐱!"
    detok = _check_stop(tok, text, ["##"], "The answer is 42, then more text ")
    assert detok.add(5) == "" and detok.text == "The answer is 42, then more text "


def test_partial_stop_is_held_then_released(tok):
    # "##" could begin "###" until the space comes; "XY" at the very end is released by flush
    detok, deltas, tail = stream(tok, tok.encode("a ## b ### c XY"), stop=["###"])
    assert "".join(deltas) + tail == "a ## b " and detok.stop_reason == "###"
    detok, deltas, tail = stream(tok, tok.encode("left XY"), stop=["XYZ"])
    assert "".join(deltas) == "left " and tail == "XY" and detok.stop_reason is None


def test_earliest_completed_stop_wins_and_include(tok):
    text = "xx abc yy"
    detok = _check_stop(tok, text, ["abc", "b"], "xx a")
    assert detok.stop_reason == "b"
    detok = _check_stop(tok, text, ["abc yy", "bc"], "xx abc", include_stop_str_in_output=True)
    assert detok.stop_reason == "bc"
    detok = _check_stop(tok, text + " tail", ["c y"], "xx abc y", include_stop_str_in_output=True)
    assert detok.finished


def test_stop_strings_ignored_before_min_tokens(tok):
    text = "stop here stop there"
    min_tokens = len(tok.encode("stop here"))
    _check_stop(tok, text, ["stop"], "stop here ", min_tokens=min_tokens)
    _check_stop(tok, text, ["stop"], "")


# ------------------------------------------------------------------ detokenizer: special tokens
def test_skip_special_tokens_switch(tok):
    special, markup = MARKUP[tok.name]
    s_id, m_id = tok.hf.convert_tokens_to_ids([special, markup])
    ids = tok.encode("hi") + [s_id] + tok.encode(" there ") + [m_id] + tok.encode(" 🐱")
    cases = {(True, False): f"hi there {markup} 🐱", (False, False): f"hi{special} there {markup} 🐱",
             (True, True): f"hi{special} there {markup} 🐱"}
    for (skip, visible), expected in cases.items():
        detok, deltas, tail = stream(tok, ids, visible=visible, skip_special_tokens=skip)
        assert "".join(deltas) + tail == detok.text == expected
        assert tok.decode(ids, skip_special_tokens=skip and not visible) == expected


def test_stop_token_text_excluded_unless_asked(tok):
    eos = tok.eos_token_ids[-1]
    eos_text = tok.token_text(eos)
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["###"], skip_special_tokens=False))
    deltas = [detok.add(i) for i in tok.encode("ab ##")]
    assert "".join(deltas) == "ab "
    assert detok.add(eos, is_stop_token=True) == "##" and detok.finished and detok.text == "ab ##"
    assert detok.stop_reason is None and detok.num_tokens == len(tok.encode("ab ##")) + 1
    detok = IncrementalDetokenizer(tok, [], SamplingParams(include_stop_str_in_output=True, skip_special_tokens=False))
    out = detok.extend(tok.encode("ab") + [eos] + tok.encode("zz"))
    assert out == "ab" + eos_text + "zz" and detok.text == out   # not flagged: an ordinary token
    detok = IncrementalDetokenizer(tok, [], SamplingParams(include_stop_str_in_output=True, skip_special_tokens=False))
    out = detok.extend(tok.encode("ab")) + detok.add(eos, is_stop_token=True)
    assert out == "ab" + eos_text and detok.finished


# ------------------------------------------------------------------ chat template
def test_chat_template_contents_and_kwargs(tokenizers):
    small = tokenizers["byte_level"]
    prompt = small.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    prompt = small.apply_chat_template([{"role": "system", "content": parts}, {"role": "user", "content": "q"}],
                                       add_generation_prompt=False)
    assert prompt == "<|im_start|>system\none\ntwo<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
    prompt = small.apply_chat_template([{"role": "user", "content": "hi"}],
                                       chat_template_kwargs={"enable_thinking": False})
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "reasoning": "use the tool",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "get", "arguments": '{"city": "Paris", "days": 2}'}}]},
               {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    tools = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
    prompt = small.apply_chat_template(history, tools=tools)
    assert prompt.startswith("<|im_start|>system\ntools: get<|im_end|>\n")
    assert ("<|im_start|>assistant\n<think>\nuse the tool\n</think>\n\n<tool_call>\n<function=get>\n"
            "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
            "<|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n") in prompt
    assert history[1]["tool_calls"][0]["function"]["arguments"].startswith("{"), \
        "the caller's messages must not be modified"
    same = dict(history[1], reasoning_content="use the tool")
    del same["reasoning"]
    assert small.apply_chat_template([history[0], same, history[2]], tools=tools) == prompt


@pytest.mark.parametrize("messages, words", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], ["image_url", "text only"]),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], ["input_audio", "text only"]),
    ([{"role": "user", "content": [{"type": "text"}]}], ["content[0]", "text"]),
    ([{"role": "user", "content": 5}], ["messages[0].content"]),
    ([], ["non-empty"]),
    ([{"content": "no role"}], ["messages[0]", "role"]),
    ([{"role": "wizard", "content": "x"}], ["chat template rejected", "unknown role wizard"]),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
     ["tool_calls[0].function.arguments", "JSON"]),
])
def test_chat_template_rejects_bad_messages(tokenizers, messages, words):
    with pytest.raises(InvalidRequest) as info:
        tokenizers["byte_level"].apply_chat_template(messages)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_chat_template_sources(tokenizers, tmp_path):
    small = tokenizers["byte_level"]
    with pytest.raises(InvalidRequest, match="may not set"):
        small.apply_chat_template([{"role": "user", "content": "x"}], chat_template_kwargs={"tokenize": True})
    override = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    msgs = [{"role": "user", "content": "x"}]
    assert Tokenizer(small.path, chat_template=override).apply_chat_template(msgs) == "[user]x"
    (tmp_path / "t.jinja").write_text("FILE {{ messages[0].content }}")
    assert Tokenizer(small.path, chat_template=tmp_path / "t.jinja").apply_chat_template(msgs) == "FILE x"
    with pytest.raises(ConfigError, match="neither an existing file nor"):
        Tokenizer(small.path, chat_template="missing.jinja")
    # a chat_template.jinja beside the tokenizer (newer saves) is used; without any template: a clear 400
    beside = tmp_path / "beside"
    beside.mkdir()
    (beside / "tokenizer.json").write_text((small.path / "tokenizer.json").read_text())
    config = json.loads((small.path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (beside / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidRequest, match="no chat template"):
        Tokenizer(beside).apply_chat_template(msgs)
    (beside / "chat_template.jinja").write_text("JINJA {{ messages[0].content }}")
    assert Tokenizer(beside).apply_chat_template(msgs) == "JINJA x"


def test_demo_chat_template(tokenizers):
    demo = tokenizers["demo"]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    prompt = demo.apply_chat_template(msgs)
    assert prompt.startswith("<|im_start|>user\na\nb<|im_end|>\n")
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    off = demo.apply_chat_template(msgs, chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = demo.encode(off, add_special_tokens=False)
    assert ids.count(248045) == 2 and 248046 in ids   # <|im_start|> twice, <|im_end|> once, as single tokens
