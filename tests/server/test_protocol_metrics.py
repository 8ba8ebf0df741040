"""No engine needed: request decoding, error bodies, the Prometheus exposition."""
import math
import re

import pytest

from catengine.errors import InvalidRequest
from catengine.metrics import Metrics
from catengine.server.protocol import ChatCompletionRequest, CompletionRequest, decode_request, error_body


def test_decode_request_errors():
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        decode_request(b"{", ChatCompletionRequest)
    with pytest.raises(InvalidRequest, match="empty"):
        decode_request(b"", ChatCompletionRequest)
    with pytest.raises(InvalidRequest, match="temperature"):
        decode_request(b'{"messages": [], "temperature": "hot"}', ChatCompletionRequest)
    with pytest.raises(InvalidRequest, match="prompt"):
        decode_request(b'{"max_tokens": 3}', CompletionRequest)
    req = decode_request(b'{"prompt": [1, 2], "unknown_field": {"x": 1}, "echo": true}', CompletionRequest)
    assert req.prompt == [1, 2] and req.echo


def test_error_body_shape():
    import json
    body = json.loads(error_body(400, "bad", "n"))
    assert body == {"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400}}


def test_metrics_exposition():
    m = Metrics('my "model"')
    m.observe_first_token(0.05)
    m.observe_token_gap(0.02, 2)
    m.observe_finished("stop", 10, 5, 1.2)
    m.observe_finished("length", 3, 7, 0.4)
    m.count_tokens(prompt_tokens=13, generation_tokens=12)
    text = m.render({"num_running": 2, "num_waiting": 1, "kv_cache_usage": 0.25, "prefix_cache_queries": 64,
                     "prefix_cache_hits": 32})
    label = 'model_name="my \\"model\\""'
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
                 "spec_decode_num_drafts_total", "spec_decode_num_accepted_tokens_total"):
        assert re.search(rf"^vllm:{name}\{{{re.escape(label)}\}} \S+$", text, re.M), name
    assert f"vllm:num_requests_running{{{label}}} 2.0" in text
    assert f"vllm:kv_cache_usage_perc{{{label}}} 0.25" in text
    assert f"vllm:prompt_tokens_total{{{label}}} 13.0" in text
    assert f"vllm:generation_tokens_total{{{label}}} 12.0" in text
    assert f'vllm:request_success_total{{{label},finished_reason="stop"}} 1.0' in text
    assert f"vllm:time_to_first_token_seconds_count{{{label}}} 1.0" in text
    assert f"vllm:inter_token_latency_seconds_count{{{label}}} 2.0" in text
    assert f'vllm:e2e_request_latency_seconds_bucket{{{label},le="+Inf"}} 2.0' in text
    assert f'vllm:e2e_request_latency_seconds_bucket{{{label},le="0.5"}} 1.0' in text
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    spec = m.render({"spec_decode_num_drafts": 4, "spec_decode_num_draft_tokens": 8,
                     "spec_decode_num_accepted_tokens": 5, "spec_decode_num_accepted_tokens_per_pos": [3, 2]})
    assert f"vllm:spec_decode_num_draft_tokens_total{{{label}}} 8.0" in spec
    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="1"}} 2.0' in spec
    # every sample line is NAME{labels} VALUE with a parseable value
    for line in text.splitlines():
        if not line.startswith("#"):
            value = line.rsplit(" ", 1)[1]
            assert value in ("+Inf", "NaN") or math.isfinite(float(value)), line
