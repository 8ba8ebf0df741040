"""vLLM's /tokenize, /detokenize and /ping, and OpenAI's GET /v1/models/{model} (in-process app, demo engine)."""
import openai.types as ot
import pytest
from starlette.testclient import TestClient

from catengine.server.app import build_app

from .conftest import MAX_MODEL_LEN, make_context

MSG = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def client(async_engine):
    with TestClient(build_app(make_context(async_engine)), raise_server_exceptions=False) as c:
        yield c


def _error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    return err


def test_tokenize_prompt(client, async_engine):
    text = "Hello, tokenizer world"
    r = client.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == async_engine.tokenizer.encode(text)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_MODEL_LEN
    assert body["token_strs"] is None
    strs = client.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()["token_strs"]
    assert len(strs) == body["count"] and all(isinstance(s, str) for s in strs)
    assert "".join(strs).replace("\u0120", " ") == text   # byte-level BPE pieces


@pytest.mark.parametrize("extra", [{"chat_template_kwargs": {"enable_thinking": False}}, {"tools": TOOLS}])
def test_tokenize_chat_counts_what_chat_completions_bills(client, extra):
    r = client.post("/tokenize", json={"messages": MSG, **extra})
    assert r.status_code == 200, r.text
    chat = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 1, **extra})
    assert chat.status_code == 200, chat.text
    assert r.json()["count"] == chat.json()["usage"]["prompt_tokens"]
    no_prompt = client.post("/tokenize", json={"messages": MSG, "add_generation_prompt": False, **extra}).json()
    assert no_prompt["count"] < r.json()["count"]


@pytest.mark.parametrize("body,status", [
    ({}, 400), ({"prompt": "a", "messages": MSG}, 400), ({"messages": [{"role": "user"}]}, 400),
    ({"prompt": 3}, 400), ({"messages": MSG, "chat_template_kwargs": {"enable_thinking": "no"}}, 400),
    ({"prompt": "a", "model": "nope"}, 404),
])
def test_tokenize_errors(client, body, status):
    _error(client.post("/tokenize", json=body), status)


def test_detokenize_round_trip_and_errors(client, async_engine):
    ids = async_engine.tokenizer.encode("round trip <|im_end|> text", add_special_tokens=False)
    r = client.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": "round trip <|im_end|> text"}
    _error(client.post("/detokenize", json={"tokens": [async_engine.vocab_size]}), 400)
    _error(client.post("/detokenize", json={"tokens": ["a"]}), 400)
    _error(client.post("/detokenize", json={"tokens": [1], "model": "nope"}), 404)


def test_model_by_id(async_engine):
    ctx = make_context(async_engine, served_model_names=("org/served-name", "alias"))
    with TestClient(build_app(ctx), raise_server_exceptions=False) as c:
        for name in ("org/served-name", "alias"):
            r = c.get(f"/v1/models/{name}")
            assert r.status_code == 200, r.text
            card = ot.Model.model_validate(r.json(), strict=True)
            assert card.id == name and card.object == "model"
        err = _error(c.get("/v1/models/nope"), 404)
        assert err["type"] == "NotFoundError" and err["param"] == "model" and "nope" in err["message"]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping(async_engine, method):
    with TestClient(build_app(make_context(async_engine, api_key="k")), raise_server_exceptions=False) as c:
        assert c.request(method, "/ping").status_code == 200
        assert c.get("/v1/models/demo").status_code == 401   # /v1 keeps its key
