"""The demo trainer's pieces: the chunked gated delta rule against its recurrence, the model written in the
published layout against transformers' Qwen3.5 and catengine (main logits and the MTP head), the tokenizer's
special tokens and the chat rendering against catengine's chat template, and a CPU smoke run of the whole script."""
import json

import pytest
import torch

from catengine.tools.train_demo import bpe, chat_data
from catengine.tools.train_demo.gdn import chunk_gated_delta_rule, recurrent_gated_delta_rule
from catengine.tools.train_demo.model import DemoConfig, DemoModel, load_checkpoint, save_checkpoint

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
             layer_types=("linear_attention", "linear_attention", "full_attention", "linear_attention"))


@pytest.mark.parametrize("T,chunk", [(37, 16), (64, 16), (5, 64)])
def test_chunked_gdn_matches_recurrence(T, chunk):
    g = torch.Generator().manual_seed(T)
    B, H, dk, dv = 2, 3, 8, 4
    q = torch.nn.functional.normalize(torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, dv, generator=g, dtype=torch.float64)
    decay = -torch.rand(B, T, H, generator=g, dtype=torch.float64) * 2   # some heads forget within a few tokens
    beta = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    want = recurrent_gated_delta_rule(q, k, v, decay, beta)
    got = chunk_gated_delta_rule(q.double(), k.double(), v.double(), decay, beta, chunk=chunk)
    # the chunked form runs in float32 (inputs are cast): bounds are float32 rounding of O(1) values
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = DemoModel(DemoConfig(**SMALL))
    with torch.no_grad():  # non-trivial norms and decays, so a (1 + w) vs w or a dropped gate shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
            else:
                p.normal_(0, 0.15)
    out = tmp_path_factory.mktemp("demo_ckpt")
    save_checkpoint(model, out, {}, eos_token_id=2, pad_token_id=1)
    return out, load_checkpoint(out)


def test_checkpoint_matches_transformers(checkpoint):
    import transformers   # a dependency: the parity check must run, never skip
    path, ours = checkpoint
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = torch.randint(0, 300, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        got = ours.logits(ours(ids))
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_checkpoint_matches_catengine_with_mtp(checkpoint):
    from catengine.models import load_model
    from catengine.models.batch import BatchMetadata

    from tests.models.helpers import PagedRunner

    path, ours = checkpoint
    ce = load_model(path, dtype=torch.float32, progress=False)
    assert ce.mtp is not None
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        h = ours(ids[None])
        runner = PagedRunner(ce)
        logits = runner.step({0: ids.tolist()}, all_rows=True)
        torch.testing.assert_close(logits, ours.logits(h)[0], rtol=1e-4, atol=1e-4)
        # the MTP head: position t sees h_t and token t+1
        want = ours.mtp_hidden(ids[None], h)[0]
        T = len(ids) - 1
        caches = ce.allocate_caches(16, 4, 2)
        batch = BatchMetadata.build([T], [T], [list(range(10))], 4, [0])
        got = ce.mtp_forward(ids[1:], BatchMetadata.positions([T], [T]), h[0, :-1], batch, caches)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_chat_rendering_matches_chat_template():
    jinja2 = pytest.importorskip("jinja2")
    from catengine.chat_template import CHAT_TEMPLATE

    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
    tmpl = env.from_string(CHAT_TEMPLATE)
    msgs = [{"role": "user", "content": "What does `json.dumps` do?"}, {"role": "assistant", "content": "It <b>."}]
    assert chat_data.render(msgs[0]["content"], msgs[1]["content"]) == tmpl.render(messages=msgs)
    prompt = tmpl.render(messages=msgs[:1], add_generation_prompt=True)
    assert chat_data.render(msgs[0]["content"], "").startswith(prompt)


def test_tokenizer_has_the_qwen_control_tokens_in_order():
    text = ["def f(x):\n    return x + 1\n", "The quick brown fox jumps over the lazy dog. " * 20] * 50
    tok = bpe.train_tokenizer(text, 512)
    ids = [tok.token_to_id(t) for t in bpe.SPECIAL_TOKENS]
    assert ids == list(range(ids[0], ids[0] + len(ids))) and ids[-1] < 512
    s = chat_data.render("hi", "<tool_call>\nx\n</tool_call>")
    enc = tok.encode(s, add_special_tokens=False)
    assert tok.decode(enc.ids, skip_special_tokens=False) == s
    assert tok.token_to_id("<|im_start|>") in enc.ids and tok.token_to_id("<tool_call>") in enc.ids


def test_training_script_smoke(tmp_path):
    from catengine.tools.train_demo.train import main

    out = tmp_path / "demo"
    assert main(["--out", str(out), "--tiny", "--max-steps", "3", "--train-seconds", "60", "--seq-len", "64",
                 "--batch", "2", "--tokenizer-mb", "0.3", "--eval-tokens", "256", "--corpus-mb", "1",
                 "--held-out-fraction", "0.3", "--sample-tokens", "3", "--eval-every", "1000"]) == 0
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["heldout_code"]["tokens"] >= 64
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mtp_num_hidden_layers"] == 1
    assert load_checkpoint(out).config.vocab_size == cfg["vocab_size"]
