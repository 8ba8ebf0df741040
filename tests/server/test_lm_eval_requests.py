"""lm-eval's ``local-completions`` requests, built by hand the way lm-eval builds them (token-id prompts, batched),
against the in-process app: loglikelihood (echo + logprobs=1 + max_tokens 1, or 0 as older lm-eval sends) equals
the sum from a float32 transformers forward of the whole sequence; generate_until (stop list, max_tokens) stops
where a request without stops would have produced the stop string. The engine here cuts prompts into 16-token
chunks and has prefix caching on, so the prompt logprobs cross chunk edges and meet cached prefixes. Also
vLLM's ``prompt_logprobs`` field (completions and chat) and its stream rule."""
import pytest
import torch
import transformers
from starlette.testclient import TestClient

from catengine.server.app import build_app

from .conftest import make_context, sse_events

ATOL = 2e-4   # float32 both sides; per token, a few 1e-5 from reordered sums (paged/chunked attention, GDN)
SEED = 1234   # lm-eval's default


@pytest.fixture(scope="module")
def engine():
    from catengine.async_engine import AsyncEngine
    from catengine.tools.demo import demo_model_path
    # the random-weight fp16 model transformers loads as the float32 reference (the trained demo is AWQ, which
    # transformers loads only through gptqmodel)
    eng = AsyncEngine(model=str(demo_model_path()), max_model_len=512, max_num_seqs=8, max_num_batched_tokens=16,
                      kv_cache_memory_bytes=32 << 20)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(build_app(make_context(engine)), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def ref(engine):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(engine.model_path), dtype=torch.float32).eval()

    def logprobs(ids):
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    return logprobs


def _requests(engine, ref):
    """(context ids, continuation ids): one continuation the model would generate greedily, two it would not."""
    tok = engine.tokenizer
    contexts = ["Question: What is the capital of France?\nAnswer:", "The quick brown fox jumps over the lazy",
                "In 1905, Albert Einstein published four papers that changed physics; the first of them"]
    pairs = []
    for i, text in enumerate(contexts):
        ctx = tok.encode(text)
        if i == 0:   # greedy continuation, from the reference itself
            cont = []
            for _ in range(4):
                cont.append(int(ref(ctx + cont)[-1].argmax()))
        else:
            cont = tok.encode(" dog and runs away" if i == 1 else " was about light quanta")
        pairs.append((ctx, cont))
    return pairs


def _reference_ll(ref, ctx, cont):
    full = ctx + cont
    lp = ref(full)
    ll = sum(lp[p - 1, full[p]].item() for p in range(len(ctx), len(full)))
    greedy = all(int(lp[p - 1].argmax()) == full[p] for p in range(len(ctx), len(full)))
    return ll, greedy


def _parse_logprobs(out, ctxlens, drop_last):
    """lm-eval's LocalCompletionsAPI.parse_logprobs (drop_last: the generated token of max_tokens=1)."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        end = -1 if drop_last else None
        tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:end]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:end]
        is_greedy = all(t == max(top.values()) for t, top in zip(tokens_logprobs, top_logprobs))
        res.append((sum(tokens_logprobs), is_greedy))
    return res


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_loglikelihood_requests(client, engine, ref, max_tokens):
    pairs = _requests(engine, ref)
    payload = {"model": "demo", "prompt": [c + x for c, x in pairs], "temperature": 0, "max_tokens": max_tokens,
               "logprobs": 1, "seed": SEED, "echo": True}
    for attempt in range(2):   # the second time the prompts' blocks are in the prefix cache
        r = client.post("/v1/completions", json=payload)
        assert r.status_code == 200, r.text
        out = r.json()
        got = _parse_logprobs(out, [len(c) for c, _ in pairs], drop_last=max_tokens == 1)
        for (ctx, cont), (ll, greedy), choice in zip(pairs, got, out["choices"]):
            want_ll, want_greedy = _reference_ll(ref, ctx, cont)
            assert ll == pytest.approx(want_ll, abs=ATOL * len(cont)), attempt
            assert greedy == want_greedy
            lp = choice["logprobs"]
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            assert len(lp["tokens"]) == len(ctx) + len(cont) + max_tokens
            if max_tokens == 0:
                assert choice["text"] == engine.tokenizer.decode(ctx + cont, skip_special_tokens=False)
        assert got[0][1] is True and got[1][1] is False
        if max_tokens == 0:
            assert out["usage"]["completion_tokens"] == 0


def test_generate_until_requests(client, engine):
    ctx = engine.tokenizer.encode("Question: Name three colours.\nAnswer:")
    base = {"model": "demo", "prompt": [ctx], "max_tokens": 24, "temperature": 0, "seed": SEED}
    free = client.post("/v1/completions", json=base).json()["choices"][0]
    text = free["text"]
    assert len(text) > 8, text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    until = ["\n\n", "Question:", stop]   # lm-eval's until list (the model's EOS string rides along too)
    r = client.post("/v1/completions", json={**base, "stop": until + ["<|endoftext|>"]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    cut = min(i for i in (text.find(s) for s in until) if i >= 0)
    assert choice["text"] == text[:cut] and choice["finish_reason"] == "stop"


def test_echo_logprobs_stream_equals_whole(client, engine):
    body = {"prompt": "Streaming echo with logprobs", "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    r = client.post("/v1/completions", json={**body, "stream": True})
    events = [e for e in sse_events(r.text.split("\n\n")) if e != "[DONE]"]
    lps = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert sum((lp[key] for lp in lps), []) == whole["logprobs"][key], key


def test_prompt_logprobs_field(client, engine, ref):
    ids = engine.tokenizer.encode("vLLM's prompt_logprobs field, in the completions response")
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1, "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["logprobs"] is None
    plp, lp = choice["prompt_logprobs"], ref(ids)
    assert plp[0] is None and len(plp) == len(ids)
    for p in range(1, len(ids)):
        entry = plp[p]
        mine = entry[str(ids[p])]
        assert mine["logprob"] == pytest.approx(lp[p - 1, ids[p]].item(), abs=ATOL)
        assert mine["decoded_token"] == engine.tokenizer.token_text(ids[p])
        tops = sorted((v for k, v in entry.items() if v["rank"] <= 2), key=lambda v: v["rank"])
        assert [v["logprob"] for v in tops] == pytest.approx(lp[p - 1].topk(2).values.tolist(), abs=ATOL)
        assert 2 <= len(entry) <= 3
    messages = [{"role": "user", "content": "hi"}]
    chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, "prompt_logprobs": 0})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in body["prompt_logprobs"][1:])
    for path, req in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": messages})):
        bad = client.post(path, json={**req, "stream": True, "prompt_logprobs": 1})
        assert bad.status_code == 400 and "prompt_logprobs" in bad.json()["error"]["message"]
        assert client.post(path, json={**req, "prompt_logprobs": 21}).status_code == 400
    assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}).status_code == 400
