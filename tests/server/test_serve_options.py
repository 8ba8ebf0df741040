"""The API-shaping vLLM flags (catengine/cli/serve_flags.py -> ServerConfig) on the in-process app with the demo
engine: --response-role, --default-chat-template-kwargs, --enable-prompt-tokens-details,
--return-tokens-as-token-ids, --generation-config / --override-generation-config; the per-request INFO line
(off with --disable-log-requests); token totals counted as they are generated (an aborted request's too); and the
periodic throughput line."""
import asyncio
import json
import logging

from starlette.testclient import TestClient

from catengine.server.app import build_app
from catengine.server.stats_log import stats_line

from .conftest import make_context, sse_events

MSG = [{"role": "user", "content": "hi"}]


def client_for(engine, **overrides) -> TestClient:
    return TestClient(build_app(make_context(engine, **overrides)), raise_server_exceptions=False)


def post(client, path, body):
    r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    return r


def test_response_role_in_message_and_first_chunk(async_engine):
    with client_for(async_engine, response_role="bot") as c:
        r = post(c, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2})
        assert r.json()["choices"][0]["message"]["role"] == "bot"
        r = post(c, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2, "stream": True})
        events = sse_events(r.text.split("\n\n"))
        assert events[0]["choices"][0]["delta"]["role"] == "bot"


def test_default_chat_template_kwargs_apply_unless_the_request_sets_them(async_engine):
    from catengine.server.chat import plan_chat
    from catengine.server.protocol import ChatCompletionRequest, decode_request
    ctx = make_context(async_engine, default_chat_template_kwargs={"enable_thinking": False})

    def prompt(body):
        plan = plan_chat(ctx, decode_request(json.dumps(body).encode(), ChatCompletionRequest))
        return async_engine.tokenizer.decode(plan.job.prompt_ids, skip_special_tokens=False)

    assert "<think>\n\n</think>" in prompt({"messages": MSG})                 # thinking off by default
    assert "<think>\n\n</think>" not in prompt({"messages": MSG, "chat_template_kwargs": {"enable_thinking": True}})


def test_generation_config_override_sets_request_defaults(async_engine):
    from catengine.server.completions import plan_completion
    from catengine.server.protocol import CompletionRequest, decode_request
    ctx = make_context(async_engine, generation_config={"temperature": 0.25})   # --generation-config vllm + override
    p = asyncio.run(plan_completion(ctx, decode_request(b'{"prompt": "hi"}', CompletionRequest))).jobs[0].params
    assert p.temperature == 0.25 and p.top_k in (0, -1, None) and p.top_p == 1.0   # the model's 0.8 / 20 not used
    p = asyncio.run(plan_completion(ctx, decode_request(b'{"prompt": "hi", "temperature": 1}',
                                                    CompletionRequest))).jobs[0].params
    assert p.temperature == 1.0


def test_prompt_tokens_details_counts_prefix_cache_hits(async_engine):
    prompt = "The same long prompt, sent twice so that its blocks come from the prefix cache. " * 6
    with client_for(async_engine, enable_prompt_tokens_details=True) as c:
        first = post(c, "/v1/completions", {"prompt": prompt, "max_tokens": 1}).json()["usage"]
        second = post(c, "/v1/completions", {"prompt": prompt, "max_tokens": 1}).json()["usage"]
        r = post(c, "/v1/chat/completions", {"messages": MSG, "max_tokens": 1, "stream": True,
                                             "stream_options": {"include_usage": True}})
        streamed = sse_events(r.text.split("\n\n"))[-2]["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] < second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < second["prompt_tokens_details"]["cached_tokens"] < second["prompt_tokens"]
    assert streamed["prompt_tokens_details"]["cached_tokens"] >= 0
    with client_for(async_engine) as c:   # off: the field is null, as in vLLM
        assert post(c, "/v1/completions", {"prompt": prompt, "max_tokens": 1}).json()["usage"][
            "prompt_tokens_details"] is None


def test_return_tokens_as_token_ids(async_engine):
    with client_for(async_engine, return_tokens_as_token_ids=True) as c:
        r = post(c, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2, "logprobs": True, "top_logprobs": 2})
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert content and all(e["token"].startswith("token_id:") and int(e["token"][9:]) >= 0 for e in content)
        assert all(t["token"].startswith("token_id:") for e in content for t in e["top_logprobs"])
        r = post(c, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "logprobs": 1})
        assert all(t.startswith("token_id:") for t in r.json()["choices"][0]["logprobs"]["tokens"])


def test_one_log_line_per_finished_request(async_engine, caplog):
    with caplog.at_level(logging.INFO, logger="catengine.server"):
        with client_for(async_engine) as c:
            rid = post(c, "/v1/chat/completions", {"messages": MSG, "max_tokens": 3, "ignore_eos": True,
                                                   "n": 2}).json()["id"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"request {rid}:")]
    assert len(lines) == 1, lines
    assert "output 6 tokens" in lines[0] and "TTFT " in lines[0] and "tok/s" in lines[0] and \
        "finish length" in lines[0], lines[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="catengine.server"):
        with client_for(async_engine, log_requests=False) as c:
            post(c, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert not [r for r in caplog.records if r.getMessage().startswith("request ")]


def test_aborted_request_tokens_are_counted(async_engine, caplog):
    from catengine.sampling import SamplingParams
    from catengine.server.serving import Job
    ctx = make_context(async_engine)
    job = Job(ctx.new_id("cmpl"), async_engine.tokenizer.encode("count me"),
              SamplingParams(max_tokens=500, ignore_eos=True, temperature=0))

    async def read_three():
        seen = 0
        gen = ctx.generate([job])
        async for _, delta in gen:
            seen += len(delta.token_ids)
            if seen >= 3:
                break
        await gen.aclose()   # what a client disconnect does
        return seen

    with caplog.at_level(logging.INFO, logger="catengine.server"):
        seen = asyncio.run(read_three())
    assert ctx.metrics.generation_tokens >= seen >= 3 and ctx.metrics.prompt_tokens == len(job.prompt_ids)
    assert ctx.metrics.finished["abort"] == 1
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"request {job.request_id}:")]
    assert len(line) == 1 and "finish abort" in line[0] and f"output {seen} tokens" in line[0], line


def test_stats_line():
    prev = {"prompt_tokens_total": 100, "generation_tokens_total": 10, "prefix_cache_queries": 64,
            "prefix_cache_hits": 0}
    cur = {"prompt_tokens_total": 300, "generation_tokens_total": 60, "prefix_cache_queries": 128,
           "prefix_cache_hits": 16, "num_running": 3, "num_waiting": 1, "kv_cache_usage": 0.125}
    line, active = stats_line(prev, cur, 10.0)
    assert active and line == ("Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
                               "Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 12.5%, "
                               "Prefix cache hit rate: 25.0%")
    idle, active = stats_line(cur, {**cur, "num_running": 0, "num_waiting": 0}, 10.0)
    assert not active and "Prefix cache hit rate: 0.0%" in idle
    spec = {**cur, "spec_decode_num_drafts": 10, "spec_decode_num_draft_tokens": 30,
            "spec_decode_num_accepted_tokens": 15}
    line, _ = stats_line(prev, spec, 10.0)
    assert line.endswith("Prefix cache hit rate: 25.0%, Mean acceptance length: 2.50, Draft acceptance rate: 50.0%")


def test_stats_logger_thread_logs_while_busy(caplog):
    import time

    from catengine.server.stats_log import StatsLogger

    class Ctx:
        tokens = 0

        def engine_stats(self):
            self.tokens += 10
            return {"generation_tokens_total": self.tokens, "num_running": 1}

    logger = StatsLogger(Ctx(), interval=0.02)
    with caplog.at_level(logging.INFO, logger="catengine.stats"):
        logger.start()
        deadline = time.time() + 10
        while not any("Avg generation throughput" in r.getMessage() for r in caplog.records):
            assert time.time() < deadline
            time.sleep(0.01)
        logger.stop()
    assert not logger._thread.is_alive()
