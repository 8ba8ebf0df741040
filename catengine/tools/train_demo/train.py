"""Build the data, train the tokenizer and the model (main LM loss + MTP t+2 loss), evaluate on the held-out
split and write the model directory. ``python -m catengine.tools.train_demo --out DIR`` (see ``--help``).

The loop runs for ``--train-seconds`` of wall time (a one-shot device run has a fixed budget and unknown
throughput); the learning rate warms up over the first steps, then follows a cosine in elapsed/budget.
Batches are random windows of the packed token streams drawn from a seeded generator.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import bpe, chat_data, corpus
from .model import DemoConfig, DemoModel, save_checkpoint

TINY = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
            layer_types=("linear_attention",) * 3 + ("full_attention",))
FINAL_RESERVE_S = 45.0           # final evaluation, samples and checkpoint on the H200
HELD_OUT_SAMPLE_CHARS = 60_000   # held-out text shipped with the model, for the CPU perplexity tests


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def encode_stream(tok, docs: list[str], sep_id: int) -> torch.Tensor:
    ids = []
    for i in range(0, len(docs), 2048):
        for enc in tok.encode_batch(docs[i:i + 2048], add_special_tokens=False):
            ids.append(enc.ids)
            ids.append([sep_id])
    return torch.tensor(list(itertools.chain.from_iterable(ids)), dtype=torch.int32)


def batch_windows(stream: torch.Tensor, n: int, T: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - T - 1, (n,), generator=gen)
    return stream[(starts[:, None] + torch.arange(T + 1)).to(stream.device)]


def losses(model: DemoModel, x: torch.Tensor, mtp_weight: float):
    """x [B, T+1]: (total, main CE, MTP CE, MTP top-1 correct count, MTP count)."""
    inp = x[:, :-1]
    h = model(inp)
    V = model.config.vocab_size
    main = F.cross_entropy(model.logits(h).float().reshape(-1, V), x[:, 1:].reshape(-1).long())
    if model.mtp is None:
        return main, main, main.new_zeros(()), 0, 1
    ml = model.logits(model.mtp_hidden(inp, h)).float()
    tgt = x[:, 2:].long()
    mtp = F.cross_entropy(ml.reshape(-1, V), tgt.reshape(-1))
    correct = (ml.argmax(-1) == tgt).sum()
    return main + mtp_weight * mtp, main, mtp, correct, tgt.numel()


@torch.no_grad()
def evaluate(model: DemoModel, stream: torch.Tensor, T: int, max_tokens: int, batch: int, device, amp) -> dict:
    """Mean main CE, MTP CE and MTP t+2 top-1 accuracy over non-overlapping windows of the stream."""
    model.eval()
    n_win = max(1, min((stream.numel() - 1) // T, max_tokens // T))
    tot = {"main": 0.0, "mtp": 0.0, "correct": 0, "count": 0, "windows": 0}
    for i in range(0, n_win, batch):
        rows = [stream[j * T:(j + 1) * T + 1] for j in range(i, min(n_win, i + batch))]
        x = torch.stack(rows).to(device)
        with amp():
            _, main, mtp, correct, count = losses(model, x, 0.0)
        tot["main"] += main.item() * len(rows)
        tot["mtp"] += float(mtp) * len(rows)
        tot["correct"] += int(correct)
        tot["count"] += count
        tot["windows"] += len(rows)
    model.train()
    w = tot["windows"]
    return {"loss": tot["main"] / w, "ppl": math.exp(tot["main"] / w), "mtp_loss": tot["mtp"] / w,
            "mtp_top1": tot["correct"] / max(1, tot["count"]), "tokens": w * T}


@torch.no_grad()
def greedy(model: DemoModel, tok, prompt: str, steps: int, device, stop_id: int) -> str:
    model.eval()
    ids = tok.encode(prompt, add_special_tokens=False).ids
    out = []
    for _ in range(steps):
        h = model(torch.tensor([ids + out], device=device))
        nxt = int(model.logits(h[:, -1]).argmax())
        if nxt == stop_id:
            break
        out.append(nxt)
    model.train()
    return tok.decode(out, skip_special_tokens=False)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m catengine.tools.train_demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="model directory to write (created)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--tiny", action="store_true", help="a toy config and corpus, for a CPU smoke test")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--train-seconds", type=float, default=360.0)
    ap.add_argument("--deadline-seconds", type=float, default=510.0,
                    help="wall-clock budget of the whole run; training ends early enough to evaluate and save")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps too (0: time only)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--chat-fraction", type=float, default=0.3, help="share of each batch from the chat stream")
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--corpus-mb", type=float, default=100.0)
    ap.add_argument("--package-mb", type=float, default=6.0)
    ap.add_argument("--tokenizer-mb", type=float, default=30.0, help="corpus characters the BPE trainer reads")
    ap.add_argument("--eval-tokens", type=int, default=500_000)
    ap.add_argument("--eval-every", type=float, default=60.0, help="seconds between quick held-out evals")
    ap.add_argument("--sample-tokens", type=int, default=80, help="greedy tokens of the two sample answers")
    ap.add_argument("--held-out-fraction", type=float, default=0.02, help="share of files held out")
    ap.add_argument("--config-json", default=None, help="DemoConfig overrides as JSON")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    overrides = dict(TINY) if args.tiny else {}
    if args.config_json:
        overrides.update(json.loads(args.config_json))
    if args.vocab:
        overrides["vocab_size"] = args.vocab
    cfg = DemoConfig(**{k: tuple(v) if k == "layer_types" else v for k, v in overrides.items()})
    log(f"python {sys.version.split()[0]} torch {torch.__version__} device {device}")

    # ---- data
    files = corpus.collect(args.seed, package_cap_mb=args.package_mb, total_cap_mb=args.corpus_mb,
                           held_out_fraction=args.held_out_fraction, stdlib_only=args.tiny,
                           limit_files=300 if args.tiny else None)
    train_files = [f for f in files if not f.held_out]
    held_files = [f for f in files if f.held_out]
    chat_train, chat_held = chat_data.build_chat(files, args.seed, workers=min(16, os.cpu_count() or 1))
    roots = sorted({f.root for f in files})
    log(f"corpus: {len(files)} files from {len(roots)} roots, {sum(len(f.text) for f in files) / 1e6:.1f} MB; "
        f"held out {len(held_files)} files; chat {len(chat_train)} train / {len(chat_held)} held-out conversations")
    train_docs = [f.text for f in train_files]
    random.Random(args.seed).shuffle(train_docs)

    # ---- tokenizer
    budget = int(args.tokenizer_mb * 1e6)
    sample, used = [], 0
    for text in itertools.chain(*zip(train_docs, itertools.cycle(chat_train))):
        if used >= budget:
            break
        sample.append(text)
        used += len(text)
    tok = bpe.train_tokenizer(sample, cfg.vocab_size, used)
    bpe.save_tokenizer(tok, out)
    eos, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    log(f"tokenizer: {tok.get_vocab_size(with_added_tokens=True)} ids trained on {used / 1e6:.1f} MB "
        f"(<|endoftext|>={eos}, <|im_end|>={im_end})")

    # ---- token streams
    code = encode_stream(tok, train_docs, eos)
    chat = encode_stream(tok, chat_train, eos)
    # the shipped sample is standard-library text only (one licence, and the same on every machine's Python)
    held_code_text = "".join(f.text + "<|endoftext|>" for f in held_files if f.root == "stdlib")
    held_chat_text = "".join(chat_held)
    held_code = encode_stream(tok, [f.text for f in held_files], eos)
    held_chat = encode_stream(tok, chat_held, eos)
    (out / "heldout_code.txt").write_text(held_code_text[:HELD_OUT_SAMPLE_CHARS], encoding="utf-8")
    (out / "heldout_chat.txt").write_text(held_chat_text[:HELD_OUT_SAMPLE_CHARS], encoding="utf-8")
    log(f"tokens: code {code.numel() / 1e6:.2f}M, chat {chat.numel() / 1e6:.2f}M, held-out code "
        f"{held_code.numel() / 1e6:.2f}M, held-out chat {held_chat.numel() / 1e6:.2f}M "
        f"({sum(len(d) for d in train_docs) / max(1, code.numel()):.2f} chars/token)")
    code, chat = code.to(device), chat.to(device)
    t_data = time.perf_counter() - t_start
    # the whole run must fit its wall-clock slot: a slow data build shortens training, not the final eval/save
    train_seconds = min(args.train_seconds, args.deadline_seconds - t_data - FINAL_RESERVE_S)
    if device.type == "cuda":
        log(f"gpu: {torch.cuda.get_device_name()}")
    log(f"data ready in {t_data:.0f} s; training for {train_seconds:.0f} s")

    # ---- model
    model = DemoModel(cfg).to(device)
    log(f"model: {model.num_parameters() / 1e6:.2f}M parameters ({cfg.vocab_size * cfg.hidden_size / 1e6:.2f}M "
        f"embedding), layers {''.join('G' if t == 'linear_attention' else 'A' for t in cfg.layer_types)} + MTP")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            eps=1e-8, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def amp():
        return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else \
            torch.autocast("cpu", enabled=False)

    gen = torch.Generator().manual_seed(args.seed)
    n_chat = round(args.batch * args.chat_fraction)
    T = args.seq_len
    step, tokens, t0, last_eval = 0, 0, time.perf_counter(), time.perf_counter()
    ema = None
    history = []
    while True:
        elapsed = time.perf_counter() - t0
        if elapsed >= train_seconds or (args.max_steps and step >= args.max_steps):
            break
        progress = min(1.0, elapsed / train_seconds)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = torch.cat([batch_windows(chat, n_chat, T, gen), batch_windows(code, args.batch - n_chat, T, gen)])
        x = x.to(device, non_blocking=True)
        with amp():
            loss, main, mtp, correct, count = losses(model, x, args.mtp_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.shape[0] * T
        if step % 25 == 0 or step == 1:
            m, t2, acc = main.item(), mtp.item(), int(correct) / count
            ema = m if ema is None else 0.8 * ema + 0.2 * m
            el = time.perf_counter() - t0
            history.append({"step": step, "tokens": tokens, "loss": m, "mtp_loss": t2, "mtp_top1": acc, "lr": lr,
                            "seconds": round(el, 1)})
            log(f"step {step:5d}  tok {tokens / 1e6:7.1f}M  loss {m:.3f}  mtp {t2:.3f} (top1 {acc:.2f})  "
                f"gnorm {float(gnorm):.2f}  lr {lr:.2e}  {tokens / el / 1e3:.0f}K tok/s")
        if time.perf_counter() - last_eval >= args.eval_every:
            ev = evaluate(model, held_code, T, 64 * T, args.batch, device, amp)
            log(f"held-out code: loss {ev['loss']:.3f} (ppl {ev['ppl']:.1f})  mtp t+2 top1 {ev['mtp_top1']:.3f}")
            last_eval = time.perf_counter()
    train_s = time.perf_counter() - t0

    # ---- final evaluation and checkpoint
    results = {"steps": step, "train_tokens": tokens, "train_seconds": round(train_s, 1),
               "data_seconds": round(t_data, 1), "parameters": model.num_parameters(), "config": overrides,
               "args": vars(args), "history": history, "corpus": {
                   "files": len(files), "held_out_files": len(held_files), "roots": roots,
                   "chars": sum(len(f.text) for f in files), "chat_train": len(chat_train),
                   "chat_held_out": len(chat_held), "code_tokens": code.numel(), "chat_tokens": chat.numel(),
                   "held_out_code_tokens": held_code.numel(), "held_out_chat_tokens": held_chat.numel()}}
    for name, stream in (("train_code", code.cpu()[: args.eval_tokens + T + 1]), ("heldout_code", held_code),
                         ("heldout_chat", held_chat)):
        if stream.numel() > T + 1:
            results[name] = evaluate(model, stream, T, args.eval_tokens, args.batch, device, amp)
            r = results[name]
            log(f"final {name}: loss {r['loss']:.3f} ppl {r['ppl']:.2f} mtp_loss {r['mtp_loss']:.3f} "
                f"mtp t+2 top1 {r['mtp_top1']:.3f} over {r['tokens']} tokens")
    for q in ("What does `json.dumps` do?", "Write a Python function that returns the factorial of n."):
        prompt = chat_data.render(q, "").split("<think>")[0] + "<think>\n\n</think>\n\n"
        ans = greedy(model, tok, prompt, args.sample_tokens, device, im_end)
        results.setdefault("samples", {})[q] = ans
        log(f"sample {q!r} -> {ans!r}")
    save_checkpoint(model, out, {}, im_end, eos)
    (out / "train_metrics.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    log(f"wrote {out} in {time.perf_counter() - t_start:.0f} s total ({t_data:.0f} s data, {train_s:.0f} s train)")
    return 0
