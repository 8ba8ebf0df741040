"""The qwen3 reasoning parser: split at </think>, with the think block opened by the prompt or by the
model, without </think> (cut off while thinking), thinking disabled; streaming equals non-streaming."""
import pytest
from hypothesis import given, settings, strategies as st

from catengine.server.reasoning import Qwen3ReasoningParser, get_reasoning_parser, prompt_opens_thinking


@pytest.mark.parametrize("text,thinking,opened,reasoning,content", [
    ("Let me think.\nOK.\n</think>\n\nThe answer is 4.", True, True, "Let me think.\nOK.", "The answer is 4."),
    ("<think>\nhmm</think>\n\nyes", True, True, "hmm", "yes"),
    ("<think>\nhmm</think>yes", True, False, "hmm", "yes"),
    ("still thinking when cut off", True, True, "still thinking when cut off", None),
    ("still thinking\n\n", True, True, "still thinking\n\n", None),
    ("no think block here", True, False, None, "no think block here"),
    ("</think>\n\nonly content", True, True, None, "only content"),
    ("a</think>b", False, False, None, "a</think>b"),
    ("", True, True, None, None),
])
def test_split(text, thinking, opened, reasoning, content):
    out = Qwen3ReasoningParser.split(text, thinking=thinking, prompt_opened=opened)
    assert (out.reasoning, out.content) == (reasoning, content)


def test_disabled_keeps_empty_content_string():
    assert Qwen3ReasoningParser.split("", thinking=False).content == ""


def test_prompt_opens_thinking():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")
    assert not prompt_opens_thinking("<|im_start|>user\nwhat does <think> do?<|im_end|>\n<|im_start|>assistant\n")


def _stream(text, cuts, **kw):
    parser = Qwen3ReasoningParser(**kw)
    events, last = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        events += parser.feed(text[last:c])
        last = c
    events += parser.finish()
    return ("".join(t for k, t in events if k == "reasoning"), "".join(t for k, t in events if k == "content"),
            [k for k, _ in events])


SAMPLES = ["abc\n\n</think>\n\ncontent </thi nk> more", "<think>\n\nx\n</think>", "\n<thin", "<think", "r</think>",
           "reason with </thin partial and \n newlines\n\n", "</think>\n", "x\n\n\n"]


@settings(max_examples=80, deadline=None, database=None)
@given(text=st.sampled_from(SAMPLES), cuts=st.lists(st.integers(0, 60), max_size=20),
       opened=st.booleans(), thinking=st.booleans())
def test_streaming_matches_split(text, cuts, opened, thinking):
    cuts = [c for c in cuts if c <= len(text)]
    r, c, kinds = _stream(text, cuts, thinking=thinking, prompt_opened=opened)
    whole = Qwen3ReasoningParser.split(text, thinking=thinking, prompt_opened=opened)
    assert r == (whole.reasoning or "") and c == (whole.content or "")
    # reasoning always comes before content
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning")


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("opened", [False, True])
def test_streaming_matches_split_at_every_cut(text, opened):
    """Every single cut and the char-by-char stream, exhaustively: the random test above found a cut right
    after an explicit <think> whose following newlines leaked into the reasoning ('<think>' | '\n\nx...')."""
    whole = Qwen3ReasoningParser.split(text, thinking=True, prompt_opened=opened)
    want = (whole.reasoning or "", whole.content or "")
    for cuts in [[c] for c in range(len(text) + 1)] + [list(range(len(text)))]:
        r, c, _ = _stream(text, cuts, thinking=True, prompt_opened=opened)
        assert (r, c) == want, cuts


def test_char_by_char_reasoning_streams_incrementally():
    text = "step one, step two\n</think>\n\nfinal"
    r, c, kinds = _stream(text, list(range(len(text))))
    assert (r, c) == ("step one, step two", "final")
    assert kinds.count("reasoning") > 5


def test_registry():
    assert get_reasoning_parser("qwen3") is Qwen3ReasoningParser
    with pytest.raises(ValueError, match="use one of"):
        get_reasoning_parser("nope")
