"""``catengine generate``: one prompt in, the generated text out, for use from a shell.

    catengine generate --model PATH "Once upon a time" --max-tokens 64
    catengine generate --chat --no-thinking "What is 2 + 2?"

With ``--chat`` the prompt is a user message rendered with the model's chat template (``--system``
adds a system message); otherwise it is raw text. The text is printed as it is generated.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from ..errors import CatEngineError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .serve import add_engine_arguments
    p.add_argument("prompt", help="the prompt text (or the user message with --chat); '-' reads stdin")
    add_engine_arguments(p)
    p.add_argument("--chat", action="store_true", help="treat the prompt as a user message (chat template)")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--no-thinking", action="store_true", help="with --chat: enable_thinking=false")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=None, help="default: the model's generation_config")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    p.add_argument("--sampling-seed", type=int, default=None, help="seed of this request's sampling")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true", help="log engine setup and print token counts")
    from .serve_flags import add_ignored_arguments
    add_ignored_arguments(p)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        from ..async_engine import AsyncEngine
        from ..sampling import SamplingParams
        from .serve import engine_kwargs
        engine = AsyncEngine(**engine_kwargs(args))
    except CatEngineError as e:
        print(f"catengine generate: {e}", file=sys.stderr)
        return 2
    try:
        tok = engine.tokenizer
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                       [{"role": "user", "content": prompt}]
            kwargs = {"enable_thinking": False} if args.no_thinking else None
            text = tok.apply_chat_template(messages, chat_template_kwargs=kwargs)
            engine_prompt = tok.encode(text, add_special_tokens=False)
        else:
            engine_prompt = tok.encode(prompt)
        fields = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                  "top_k": args.top_k, "min_p": args.min_p, "repetition_penalty": args.repetition_penalty,
                  "stop": args.stop, "seed": args.sampling_seed, "ignore_eos": args.ignore_eos}
        from .serve_flags import generation_defaults
        params = SamplingParams.from_request(fields, generation_defaults(args, tok.generation_config))
        return asyncio.run(_stream(engine, engine_prompt, params, args.verbose))
    except CatEngineError as e:
        print(f"catengine generate: {e}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()


async def _stream(engine, prompt_ids: list[int], params, verbose: bool) -> int:
    last = None
    async for delta in engine.stream(prompt_ids, params, request_id="generate-cli"):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
        last = delta
    sys.stdout.write("\n")
    if verbose and last is not None:
        print(f"[{last.num_prompt_tokens} prompt tokens, {last.num_output_tokens} generated, "
              f"finish_reason {last.finish_reason}]", file=sys.stderr)
    return 0
