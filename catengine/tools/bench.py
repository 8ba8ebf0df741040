"""`catengine bench`: end-to-end numbers on random-weight checkpoints with the published dimensions (issue 8).

    catengine bench --device cuda --out bench.json                  # 27B AWQ and 35B-A3B AWQ, every engine section
    catengine bench --model-preset qwen3.5-27b --transformers --correctness
    catengine bench --device cpu --quick                            # tiny models and lengths: a smoke run

Checkpoints are written once to ``--workdir`` (never into the repository) and reused while complete
(``config.json`` is written last). Every latency is wall time around ``Engine.generate`` of random token ids with
prefix caching off, the median of ``--reps`` runs after one warm-up of the same shape. Sections:

- ``decode``: incremental batch-1 decode TPS ``(N - 1) / (median t(prompt + N) - median t(prompt + 1))`` (N = 64) at
  short (512) and long (8K) context: prefill and the first token cancel, only decode steps remain;
- ``prefill``: prompt tokens / latency of a max_tokens=1 request (8K and 32K);
- ``concurrent``: output tokens / wall time of 8, 32, 64 requests of 256 in / 128 out submitted together;
- ``roofline``: bytes one batch-1 decode step must read (weights incl. lm_head, the routed share of the experts,
  KV at the context, GDN states read + written) / measured copy bandwidth, and decode as a fraction of it;
- ``kv_fp8``: incremental decode TPS at 32K with fp16 vs fp8_e5m2 KV;
- ``cuda_graphs``: short-context batch-1 incremental decode TPS with decode CUDA graphs vs ``enforce_eager``;
- ``transformers`` / ``correctness`` (``--transformers`` / ``--correctness``): :mod:`catengine.tools.correctness`;
- ``quality``: held-out perplexity of the trained demo model per numeric path, :mod:`catengine.tools.bench_quality`.
The vLLM 0.25 figures of issue 8 (same kind of checkpoints, same H200) are printed beside ours. The flags are parsed
in :mod:`catengine.cli.bench`; the presets and checkpoints shared with the correctness sections are in
:mod:`catengine.tools.bench_common`.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from .bench_common import (PEERS, checkpoint, incremental_tps, print_table, random_prompts, resolve_preset,
                           sync_device)

ENGINE_SECTIONS = ("decode", "prefill", "concurrent", "roofline", "kv_fp8", "cuda_graphs")
SECTIONS = ENGINE_SECTIONS + ("transformers", "correctness", "quality", "mtp")


@dataclass(frozen=True)
class Sizes:
    short_ctx: int = 512
    long_ctx: int = 8192
    decode_tokens: int = 64
    reps: int = 5
    prefill_lens: tuple[int, ...] = (8192, 32768)
    concurrency: tuple[int, ...] = (8, 32, 64)
    conc_in: int = 256
    conc_out: int = 128
    fp8_ctx: int = 32768
    hf_tokens: int = 32          # transformers is ~8 tok/s on the 27B: fewer tokens, same formula
    hf_reps: int = 2
    corr_tokens: int = 512
    corr_layers: int = 8
    corr_hidden: int = 1024
    bandwidth_bytes: int = 2 << 30

    @property
    def max_model_len(self) -> int:
        return max(self.long_ctx, self.fp8_ctx, *self.prefill_lens) + self.decode_tokens + 16


# every path once with the fewest model steps: the CPU smoke run takes seconds, its numbers mean nothing
QUICK = Sizes(short_ctx=16, long_ctx=40, decode_tokens=3, reps=1, prefill_lens=(32,), concurrency=(2,),
              conc_in=8, conc_out=3, fp8_ctx=48, hf_tokens=3, hf_reps=1, corr_tokens=12, corr_layers=4,
              corr_hidden=128, bandwidth_bytes=32 << 20)


# ----------------------------------------------------------------------------- roofline inputs
def measure_copy_bandwidth(device="cuda", nbytes: int = 2 << 30, reps: int = 5) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written (median of ``reps``)."""
    device = torch.device(device)
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    times, batch = [], 8  # copies back to back between syncs: the sync's latency stays out of the number
    for i in range(reps + 1):
        sync_device(device)
        t0 = time.perf_counter()
        for _ in range(batch):
            dst.copy_(src)
        sync_device(device)
        if i:  # the first batch pages memory in
            times.append((time.perf_counter() - t0) / batch)
    return 2 * src.numel() / statistics.median(times) / 1e9


def safetensors_sizes(path: Path) -> dict[str, int]:
    """{tensor name: bytes} from the safetensors headers of a model directory (no tensor is read)."""
    sizes = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                sizes[name] = info["data_offsets"][1] - info["data_offsets"][0]
    return sizes


def decode_weight_bytes(sizes: dict[str, int], num_experts: int = 0, top_k: int = 0) -> int:
    """Weight bytes one batch-1 decode step reads: every tensor but the embedding (one row) and the MTP head,
    routed experts at their top-k share (shared experts, router and lm_head in full)."""
    total = 0.0
    for name, nbytes in sizes.items():
        if "embed_tokens" in name or name.startswith("mtp.") or "visual" in name:
            continue
        routed = ".mlp.experts." in name
        total += nbytes * (top_k / num_experts if routed and num_experts else 1.0)
    return int(total)


# ----------------------------------------------------------------------------- engine sections
class EngineBench:
    def __init__(self, path: Path, args, sizes: Sizes, kv_cache_dtype: str = "auto"):
        from ..engine import Engine
        from ..sampling import SamplingParams
        self.sp = SamplingParams
        self.sizes, self.rng = sizes, random.Random(0)
        max_seqs = max(sizes.concurrency + (1,))
        self.engine = Engine(model=str(path), device=args.device, dtype=args.dtype, kv_cache_dtype=kv_cache_dtype,
                             max_model_len=sizes.max_model_len, max_num_seqs=max_seqs,
                             max_num_batched_tokens=max(args.max_num_batched_tokens, max_seqs),
                             enable_prefix_caching=False, enforce_eager=args.enforce_eager,
                             gpu_memory_utilization=args.gpu_memory_utilization)
        self.vocab = self.engine.vocab_size

    def latencies(self, count: int, prompt_len: int, out: int, reps: int) -> list[float]:
        params = self.sp(temperature=0, max_tokens=out, ignore_eos=True)
        times = []
        for i in range(reps + 1):  # the first run is the warm-up (compilation, graph capture)
            prompts = random_prompts(self.rng, count, prompt_len, self.vocab)
            sync_device(self.engine.device)
            t0 = time.perf_counter()
            outs = self.engine.generate(prompts, params)
            sync_device(self.engine.device)
            if i:
                times.append(time.perf_counter() - t0)
            assert all(len(o.token_ids) == out for o in outs), "ignore_eos requests ended early"
        return times

    def decode_tps(self, ctx: int) -> float:
        n, reps = self.sizes.decode_tokens, self.sizes.reps
        return incremental_tps(self.latencies(1, ctx, n, reps), self.latencies(1, ctx, 1, reps), n)

    def prefill_tps(self, length: int) -> float:
        return length / statistics.median(self.latencies(1, length, 1, self.sizes.reps))

    def concurrent_tps(self, count: int) -> float:
        s = self.sizes
        return count * s.conc_out / statistics.median(self.latencies(count, s.conc_in, s.conc_out, max(1, s.reps // 2)))

    def step_bytes(self, path: Path, ctx: int, kv_cache_dtype: str = "auto") -> dict[str, int]:
        mc, model, bs = self.engine.model_config, self.engine.model, self.engine.config.block_size
        weights = decode_weight_bytes(safetensors_sizes(path), mc.num_experts, mc.num_experts_per_tok)
        kv = model.kv_cache_bytes_per_block(bs, kv_cache_dtype) * ctx // bs
        state = 2 * model.state_bytes_per_slot(self.engine.config.ssm_torch_dtype)
        return {"weights": weights, "kv": kv, "gdn_state": state, "total": weights + kv + state}

    def close(self) -> None:
        self.engine.close()
        self.engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_engine_sections(preset: str, path: Path, args, sizes: Sizes, sections: set[str], bandwidth) -> dict:
    res: dict = {}
    peer = PEERS.get(preset, {})
    b = EngineBench(path, args, sizes)
    graphs_used = b.engine.runner.graphs is not None   # CUDA without --enforce-eager
    try:
        if "decode" in sections or "roofline" in sections or "kv_fp8" in sections:
            ctxs = {"short": sizes.short_ctx, "long": sizes.long_ctx}
            if "kv_fp8" in sections:
                ctxs["fp8_ctx"] = sizes.fp8_ctx
            res["decode_b1"] = {k: {"ctx": c, "tps": b.decode_tps(c)} for k, c in ctxs.items()}
            print_table(f"{preset}: incremental decode, batch 1 (tok/s)", ["context", "catengine", "vLLM 0.25"],
                        [[c["ctx"], c["tps"], peer.get(f"decode_b1_{k}")] for k, c in res["decode_b1"].items()
                         if k != "fp8_ctx"])
        if "prefill" in sections:
            res["prefill"] = {str(n): b.prefill_tps(n) for n in sizes.prefill_lens}
            print_table(f"{preset}: prefill (prompt tok/s)", ["prompt", "catengine", "vLLM 0.25"],
                        [[n, v, peer.get(f"prefill_{n}")] for n, v in res["prefill"].items()])
        if "concurrent" in sections:
            res["concurrent"] = {str(n): b.concurrent_tps(n) for n in sizes.concurrency}
            print_table(f"{preset}: concurrent decode, {sizes.conc_in} in / {sizes.conc_out} out (output tok/s)",
                        ["requests", "catengine", "vLLM 0.25"],
                        [[n, v, peer.get(f"concurrent_{n}")] for n, v in res["concurrent"].items()])
        if "roofline" in sections:
            bw = bandwidth()
            rows, res["roofline"] = [], {"copy_bandwidth_gbs": bw}
            for k in ("short", "long"):
                d = res["decode_b1"][k]
                step = b.step_bytes(path, d["ctx"])
                roof = bw * 1e9 / step["total"]
                res["roofline"][k] = {"ctx": d["ctx"], "bytes": step, "roofline_tps": roof,
                                      "fraction": d["tps"] / roof}
                rows.append([d["ctx"], step["weights"] / 1e9, step["kv"] / 1e9, step["gdn_state"] / 1e9, roof,
                             d["tps"], d["tps"] / roof])
            print_table(f"{preset}: decode roofline at {bw:.0f} GB/s copy bandwidth",
                        ["context", "weights GB", "KV GB", "GDN GB", "roofline tok/s", "b1 tok/s", "fraction"], rows)
    finally:
        b.close()
    if "kv_fp8" in sections:
        b = EngineBench(path, args, sizes, kv_cache_dtype="fp8_e5m2")
        try:
            fp8 = b.decode_tps(sizes.fp8_ctx)
        finally:
            b.close()
        fp16 = res["decode_b1"].pop("fp8_ctx")["tps"]
        res["kv_fp8"] = {"ctx": sizes.fp8_ctx, "fp16_tps": fp16, "fp8_e5m2_tps": fp8, "ratio": fp8 / fp16}
        print_table(f"{preset}: KV cache dtype at {sizes.fp8_ctx} context (incremental decode tok/s, batch 1)",
                    ["fp16 KV", "fp8_e5m2 KV", "fp8 / fp16"], [[fp16, fp8, fp8 / fp16]])
    if "cuda_graphs" in sections and not graphs_used:
        # no graphs to compare (CPU, --enforce-eager, a failed capture): a ratio of eager to eager would mislead
        why = "--enforce-eager" if args.enforce_eager else f"no decode CUDA graphs on {args.device}"
        res["cuda_graphs"] = {"ctx": sizes.short_ctx, "graphs_used": False, "skipped": why}
        print(f"### {preset}: decode CUDA graphs vs eager: skipped ({why})", flush=True)
    elif "cuda_graphs" in sections:
        b = EngineBench(path, argparse.Namespace(**{**vars(args), "enforce_eager": True}), sizes)
        try:
            eager = b.decode_tps(sizes.short_ctx)
        finally:
            b.close()
        graphs = res["decode_b1"]["short"]["tps"]
        res["cuda_graphs"] = {"ctx": sizes.short_ctx, "graphs_used": graphs_used, "graphs_tps": graphs,
                              "eager_tps": eager, "ratio": graphs / eager}
        print_table(f"{preset}: decode CUDA graphs vs eager at {sizes.short_ctx} context (incremental tok/s, batch 1)",
                    ["CUDA graphs", "eager", "graphs / eager"], [[graphs, eager, graphs / eager]])
    return res


# ----------------------------------------------------------------------------- the run
def parse_sections(text: str, transformers: bool = False, correctness: bool = False) -> list[str]:
    chosen: list[str] = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        names = SECTIONS if item == "all" else ENGINE_SECTIONS if item == "engine" else (item,)
        for n in names:
            if n not in SECTIONS:
                raise ConfigError(f"unknown section {n!r} in --sections; use a comma list of {', '.join(SECTIONS)}, "
                                  "'engine' or 'all'")
            if n not in chosen:
                chosen.append(n)
    chosen += [n for n, on in (("transformers", transformers), ("correctness", correctness)) if on and n not in chosen]
    for needs_decode in ("roofline", "cuda_graphs"):   # both are read against the measured decode
        if needs_decode in chosen and "decode" not in chosen:
            chosen.insert(chosen.index(needs_decode), "decode")
    if not chosen:
        raise ConfigError("--sections selected nothing; e.g. --sections decode,prefill or --sections all")
    return chosen


def run_bench(args) -> int:
    """Every chosen section for every preset; ConfigError for arguments that cannot be honoured (raised before
    anything is written)."""
    import logging

    from ..config import resolve_device
    if not logging.getLogger().handlers:   # the engine's start-up lines (memory plan, warm-up, graphs)
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sections = parse_sections(args.sections, args.transformers, args.correctness)
    device = resolve_device(args.device)
    args.device = str(device)
    sizes = QUICK if args.quick else Sizes()
    if args.reps is not None:
        if args.reps < 1:
            raise ConfigError(f"--reps must be >= 1, got {args.reps}")
        sizes = Sizes(**{**asdict(sizes), "reps": args.reps})
    presets = [resolve_preset(p) for p in (args.presets or (["tiny-dense", "tiny-moe"] if args.quick else
                                                            ["qwen3.5-27b", "qwen3.6-35b-a3b"]))]
    workdir = Path(args.workdir).expanduser()
    out = Path(args.out) if args.out else workdir / "bench.json"
    bw_cache: list[float] = []

    def bandwidth() -> float:
        if not bw_cache:
            bw_cache.append(measure_copy_bandwidth(device, sizes.bandwidth_bytes))
        return bw_cache[0]

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"device": name, "torch": torch.__version__, "sections": sections, "quick": args.quick,
              "enforce_eager": args.enforce_eager, "sizes": asdict(sizes), "peers_vllm_0_25": PEERS, "models": {}}
    for preset in presets:
        res = report["models"][preset] = {}
        engine_sections = set(sections) & set(ENGINE_SECTIONS)
        if engine_sections:
            path = checkpoint(workdir, preset, "awq", args.device)
            res["checkpoint"] = str(path)
            res.update(run_engine_sections(preset, path, args, sizes, engine_sections, bandwidth))
        if "transformers" in sections:
            from .correctness import transformers_baseline
            res["transformers"] = transformers_baseline(preset, workdir, args, sizes, res.get("decode_b1"))
        _write(out, report)
    if "correctness" in sections:
        from .correctness import correctness_report
        report["correctness"] = correctness_report(workdir, args, sizes)
    if "quality" in sections:
        from .bench_quality import quality_report
        report["quality"] = quality_report(args, max_tokens=256 if args.quick else 4096)
    if "mtp" in sections:
        from .bench_spec import mtp_report
        report["mtp"] = mtp_report(args, ks=(1, 3), tokens=24, batches=(1,)) if args.quick else mtp_report(args)
    _write(out, report)
    print(f"wrote {out}")
    return 0


def _write(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_finite(report), indent=2, default=str) + "\n")


def _finite(obj):
    """NaN / inf (an incremental TPS lost in noise) become null: the JSON stays strict."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
