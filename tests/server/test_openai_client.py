"""The official ``openai`` client against a real ``catengine serve`` subprocess (demo model, CPU)."""
import json

import httpx
import openai
import pytest

from .conftest import MAX_MODEL_LEN, serve_subprocess, sse_events

KEY = "test-key-123"
MODEL = "demo-served"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def server():
    from catengine.tools.demo import demo_model_path
    # the random-weight model with the real Qwen3.5 vocabulary, whose tokenizer the tests use (not the trained demo)
    with serve_subprocess(["--model", str(demo_model_path()), "--api-key", KEY, "--served-model-name", MODEL,
                           "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(64 << 20),
                           "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser",
                           "qwen3", "--attention-backend", "FLASH_ATTN_V100", "--trust-remote-code",
                           "--log-level", "info"]) as (base, log):
        yield base, log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer():
    from catengine.tools.demo import demo_model_path
    from catengine.tokenizer import Tokenizer
    return Tokenizer(demo_model_path())


def test_startup_banner_and_plain_endpoints(server):
    base, log = server
    banner = log.read_text()
    assert f"http://127.0.0.1:{base.rsplit(':', 1)[1]}/v1" in banner
    assert "KV cache" in banner and f"max_model_len {MAX_MODEL_LEN}" in banner and MODEL in banner
    assert "--attention-backend FLASH_ATTN_V100 is a vLLM-internal setting" in banner
    assert httpx.get(base + "/version").json()["version"]
    metrics = httpx.get(base + "/metrics").text
    assert f'vllm:num_requests_running{{model_name="{MODEL}"}}' in metrics


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_auth(server):
    base = server[0]
    r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(base + "/health").status_code == 200  # outside /v1: no key needed


def test_unknown_model_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi", max_tokens=1)


def test_completion_stream_equals_full(client, tokenizer):
    prompt = "The quick brown fox"
    kw = dict(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    n_prompt = len(tokenizer.encode(prompt))
    assert (full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens) == (n_prompt, 10,
                                                                                                n_prompt + 10)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == n_prompt
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 11}])
def test_chat_stream_equals_full(client, tokenizer, sampling):
    messages = [{"role": "user", "content": "Say hello"}]
    kw = dict(model=MODEL, messages=messages, max_tokens=12, extra_body=NO_THINK, **sampling)
    full = client.chat.completions.create(**kw)
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    msg = full.choices[0].message
    assert msg.role == "assistant" and full.choices[0].finish_reason in ("stop", "length")
    prompt = tokenizer.apply_chat_template(messages, chat_template_kwargs={"enable_thinking": False})
    assert full.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (msg.content or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_length_and_reasoning(client):
    # thinking on: the template opens <think>, so the demo model's text is reasoning until </think>
    # (seeded sampling: at temperature 0 the demo model only writes newlines, which frame </think>)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Think"}], max_tokens=8, temperature=1.0,
              seed=5, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "length" and full.usage.completion_tokens == 8
    reasoning = getattr(choice.message, "reasoning_content", None)
    assert reasoning == getattr(choice.message, "reasoning", None)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed_r = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    streamed_c = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed_r == (reasoning or "") and streamed_c == (choice.message.content or "")
    assert reasoning


def test_n_and_seed(client):
    kw = dict(model=MODEL, prompt="Once", max_tokens=5, n=3, seed=7, temperature=1.0, extra_body={"ignore_eos": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.completion_tokens == 15
    chunks = list(client.completions.create(stream=True, **kw))
    finishes = sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason)
    assert finishes == [0, 1, 2]
    for i in range(3):
        assert "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) == a.choices[i].text


def test_token_prompts_echo_and_batch(client, tokenizer):
    ids = tokenizer.encode("Hello there")
    other = tokenizer.encode("Other")
    kw = dict(model=MODEL, max_tokens=3, temperature=0, echo=True, extra_body={"ignore_eos": True})
    out = client.completions.create(prompt=[ids, other], **kw)
    assert len(out.choices) == 2
    assert out.choices[0].text.startswith("Hello there") and out.choices[1].text.startswith("Other")
    assert out.usage.prompt_tokens == len(ids) + len(other) and out.usage.completion_tokens == 6
    single = client.completions.create(prompt=ids, **kw)
    assert single.choices[0].text == out.choices[0].text
    strings = client.completions.create(prompt=["Hello there", "Other"], **kw)
    assert [c.text for c in strings.choices] == [c.text for c in out.choices]
    chunks = list(client.completions.create(prompt=["Hello there", "Other"], stream=True, **kw))
    for i in range(2):
        assert "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) == out.choices[i].text


def test_logprobs(client):
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                         temperature=0, logprobs=True, top_logprobs=3,
                                         extra_body={"ignore_eos": True, **NO_THINK})
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3 and isinstance(entry.bytes, list)
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-4  # greedy: the chosen one is the top
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=3, stream=True, extra_body={"ignore_eos": True, **NO_THINK}))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    comp = client.completions.create(model=MODEL, prompt="a b", max_tokens=3, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == comp.choices[0].text
    assert all(len(t) >= 2 for t in lp.top_logprobs)


def test_raw_sse_format(server):
    base = server[0]
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 4, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", base + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = sse_events(raw.split("\n\n"))
    assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 4
    assert sum(1 for e in events[:-1] for c in e["choices"] if c["finish_reason"]) == 1


def test_forced_tool_call_stream_equals_full(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
              tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=20, temperature=0)
    full = client.chat.completions.create(**kw)
    calls = full.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    json.loads(calls[0].function.arguments)
    assert full.choices[0].finish_reason in ("tool_calls", "length")
    chunks = list(client.chat.completions.create(stream=True, **kw))
    headers = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or []) if tc.id]
    assert headers[0].function.name == "get_weather" and headers[0].function.arguments == ""
    args = {}
    for c in chunks:
        for tc in c.choices[0].delta.tool_calls or []:
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert [args[i] for i in sorted(args)] == [c.function.arguments for c in calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == \
        [full.choices[0].finish_reason]


def test_request_lines_and_never_the_api_key_in_the_log(server):
    """Runs last (file order): every request above left its INFO line; the key never reached the console."""
    text = server[1].read_text()
    lines = [line for line in text.splitlines() if "catengine.server: request chatcmpl-" in line]
    assert lines and all("TTFT" in line and "finish " in line for line in lines), text[-3000:]
    assert KEY not in text
