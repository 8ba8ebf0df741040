"""The registry bench/v100_projection.py projects: each op (a public launcher), the shapes of its per-kernel
table, how to build its inputs on CUDA, its flops, and per kernel name the trip counts of its loops and (where
the tensors handed over are not the bytes read) its DRAM bytes.

A new sm_70 kernel plugs in when its launcher's choice is a table field (``hmma_min_m`` / ``hmma`` on the sm_70 row
of ``TABLES``, HMMA_TABLES) or a predicate (HMMA_SWITCHES): the HMMA pass records whatever the sm_70 row launches
(a Gluon kernel: the HMMA.884 path), and the FMA pass turns those off (tl.dot, FMA on sm_70).
A new kernel with loops needs its line in TRIPS (its loops count once per program otherwise, and the tables say
so).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable

import torch

GROUP = 128
# where the builders put their inputs: "cuda" for the projection; "cpu" lets a CPU dry run record the launches
# (bench/v100_projection.py --dry-cpu: nothing runs, the launchers only choose)
DEVICE = "cuda"
# modules whose TABLES["sm70"] may carry hmma_min_m (set to None) or hmma (set to False) for the FMA pass
HMMA_TABLES = ("catengine.kernels.w4a16.gemm", "catengine.kernels.moe.fused", "catengine.kernels.attention.paged",
               "catengine.kernels.gdn.table")
# predicates a launcher asks before it takes its sm_70 kernel (patched to False for the FMA pass); names that a
# module does not have are skipped, so a family's switch can be listed before its kernel lands
HMMA_SWITCHES = (("catengine.kernels.w4a16.gemm", "hmma_applies"), ("catengine.kernels.moe.fused", "hmma_moe_applies"),
                 ("catengine.kernels.attention.paged", "sm70_applies"), ("catengine.kernels.gdn.chunk", "h_hmma_applies"),
                 ("catengine.kernels.gdn.chunk", "o_hmma_applies"), ("catengine.kernels.gdn.chunk", "wy_hmma_applies"))


@contextlib.contextmanager
def fma_path():
    """The sm_70 row without its HMMA.884 kernels: tl.dot everywhere, which Triton >= 3.3 lowers to FMA (for GDN
    the scan form: the split is on the row for its HMMA.884 stages only)."""
    undo = []
    for name in HMMA_TABLES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        # TABLES["sm70"] (w4a16, moe, attention) or TABLE[70] (gdn)
        for tables, key in ((getattr(mod, "TABLES", None), "sm70"), (getattr(mod, "TABLE", None), 70)):
            row = tables.get(key) if isinstance(tables, dict) else None
            # GDN's h_hmma / o_hmma stay: with its predicates off the row falls back to the scan, as chunk.py does
            # wherever no HMMA.884 stage applies (the row's tl.dot split is not what a V100 would run)
            for field, off in (("hmma_min_m", None), ("hmma", False)):
                if row is not None and getattr(row, field, None) not in (None, False):
                    undo.append((tables.__setitem__, key, row))
                    row = dataclasses.replace(row, **{field: off})
                    tables[key] = row
    for name, attr in HMMA_SWITCHES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(mod, attr, None)):
            undo.append((lambda a, v, m=mod: setattr(m, a, v), attr, getattr(mod, attr)))
            setattr(mod, attr, lambda *a, **k: False)
    try:
        yield
    finally:
        for fn, key, value in reversed(undo):
            fn(key, value)


@dataclass(frozen=True)
class Op:
    name: str
    family: str
    make: Callable[[dict], Callable[[], object]]     # shape -> zero-argument call on CUDA
    flops: Callable[[dict], float]
    # the bytes the op must move (weights, inputs, outputs; no split-K partials, no re-reads): what the tables' "% of
    # 900 GB/s" divides, None to take the launches' tensors
    bytes: Callable[[dict], float] | None = None


# ---------------------------------------------------------------- input builders
def _qweight(k: int, n: int, lead=()):
    from catengine.kernels.w4a16.packing import QuantizedWeight
    # random int32 words are random nibbles: no packing pass over K x N codes
    q = torch.randint(-2**31, 2**31 - 1, (*lead, k // 8, n), device=DEVICE, dtype=torch.int32)
    s = (torch.rand(*lead, k // GROUP, n, device=DEVICE) * 1e-2 + 1e-3).half()
    z = torch.randint(0, 16, (*lead, k // GROUP, n), device=DEVICE).half()
    return QuantizedWeight(q, s, z, GROUP)


def make_linear(s: dict):
    from catengine.kernels.w4a16.gemm import fused_w4a16_linear
    w = _qweight(s["K"], s["N"])
    x = torch.randn(s["M"], s["K"], device=DEVICE, dtype=torch.float16)
    return lambda: fused_w4a16_linear(x, w)


def make_moe(s: dict):
    from catengine.kernels.moe.fused import fused_moe
    e, topk, h, inter = s["E"], s["topk"], s["H"], s["I"]
    w13, w2 = _qweight(h, 2 * inter, (e,)), _qweight(inter, h, (e,))
    x = torch.randn(s["T"], h, device=DEVICE, dtype=torch.float16)
    ids = torch.rand(s["T"], e, device=DEVICE).topk(topk, dim=1).indices.to(torch.int32)
    tw = torch.softmax(torch.rand(s["T"], topk, device=DEVICE), dim=1)
    s["touched"] = int(ids.unique().numel())
    return lambda: fused_moe(x, w13, w2, tw, ids)


def make_attention(s: dict):
    from catengine.kernels.attention.paged import paged_attention
    b, ctx, ql, nh, nkv, d, bs = s["B"], s["ctx"], s["q"], s["nh"], s["nkv"], s["d"], 16
    per = -(-ctx // bs)
    kc = torch.randn(b * per, bs, nkv, d, device=DEVICE, dtype=torch.float16)
    vc = torch.randn_like(kc)
    tables = torch.randperm(b * per, device=DEVICE, dtype=torch.int32).view(b, per)
    seq = torch.full((b,), ctx, device=DEVICE, dtype=torch.int32)
    qsl = torch.arange(0, (b + 1) * ql, ql, device=DEVICE, dtype=torch.int32)
    q = torch.randn(b * ql, nh, d, device=DEVICE, dtype=torch.float16)
    return lambda: paged_attention(q, kc, vc, tables, seq, qsl, d ** -0.5, ql, ctx)


def _gdn_inputs(s: dict):
    b, t, hk, hv, dk, dv = s["B"], s["B"] * s["L"], s["hk"], s["hv"], 128, 128
    q, k = (torch.randn(t, hk, dk, device=DEVICE).half() for _ in range(2))
    v = torch.randn(t, hv, dv, device=DEVICE).half()
    # gdn_gating's fp32 outputs: log-decay g < 0 and beta in (0, 1)
    g = -torch.rand(t, hv, device=DEVICE) * 0.5
    beta = torch.rand(t, hv, device=DEVICE)
    ssm = torch.randn(b, hv, dk, dv, device=DEVICE) * 0.1
    qsl = torch.arange(0, t + 1, s["L"], device=DEVICE, dtype=torch.int32)
    slots = torch.arange(b, device=DEVICE, dtype=torch.int32)
    has = torch.ones(b, dtype=torch.bool, device=DEVICE)
    return q, k, v, g, beta, ssm, qsl, slots, has


def make_gdn_chunk(s: dict):
    from catengine.kernels.gdn.chunk import chunk_gated_delta_rule
    args = _gdn_inputs(s)
    return lambda: chunk_gated_delta_rule(*args, 128 ** -0.5)


def make_gdn_recurrent(s: dict):
    from catengine.kernels.gdn.recurrent import recurrent_gated_delta_rule
    args = _gdn_inputs(s)
    return lambda: recurrent_gated_delta_rule(*args, 128 ** -0.5)


def _attn_flops(s):
    b, ctx, ql, nh, d = s["B"], s["ctx"], s["q"], s["nh"], s["d"]
    keys = ql * (ctx - ql) + ql * (ql + 1) / 2      # causal: query i sees ctx - q + i + 1 keys
    return 4 * b * nh * d * keys


def _linear_bytes(s):
    """int4 codes, fp16 scales and zeros per group of GROUP, fp16 x and y."""
    return s["K"] * s["N"] / 2 + 2 * 2 * (s["K"] // GROUP) * s["N"] + 2 * s["M"] * (s["K"] + s["N"])


def _attn_bytes(s):
    """fp16 K and V of every sequence's context (each KV head once), q and the output."""
    return 2 * 2 * s["B"] * s["ctx"] * s["nkv"] * s["d"] + 2 * 2 * s["B"] * s["q"] * s["nh"] * s["d"]


OPS = {
    "w4a16": Op("W4A16 GEMM/GEMV", "w4a16", make_linear, lambda s: 2 * s["M"] * s["K"] * s["N"], _linear_bytes),
    "moe": Op("fused MoE", "moe", make_moe, lambda s: 2 * s["T"] * s["topk"] * 3 * s["H"] * s["I"]),
    "attn": Op("paged attention", "attention", make_attention, _attn_flops, _attn_bytes),
    "gdn_chunk": Op("GDN chunked prefill", "gdn", make_gdn_chunk,
                    lambda s: s["B"] * s["hv"] * -(-s["L"] // 64) * 64 * 128 * 128 * 2 * 6),
    "gdn_rec": Op("GDN recurrent", "gdn", make_gdn_recurrent, lambda s: s["B"] * s["L"] * s["hv"] * 128 * 128 * 2 * 4),
}


# ---------------------------------------------------------------- shapes
def _lin(m, k, n):
    return ("w4a16", {"M": m, "K": k, "N": n, "label": f"M={m} {k}->{n}"})


# the per-kernel table: the 27B gate_up shape (5120 -> 17408) over M, the 35B MoE block, 27B attention, 27B GDN
KERNEL_SHAPES = (
    [_lin(m, 5120, 17408) for m in (1, 8, 16, 32, 64, 128, 256, 1024, 4096)]
    + [("moe", {"T": t, "E": 256, "topk": 8, "H": 2048, "I": 512, "label": f"35B T={t}"}) for t in (1, 32, 8192)]
    + [("attn", {"B": 1, "ctx": 8192, "q": 8192, "nh": 24, "nkv": 4, "d": 256, "label": "27B prefill 8K"}),
       ("attn", {"B": 8, "ctx": 8192, "q": 1, "nh": 24, "nkv": 4, "d": 256, "label": "27B decode B=8 ctx 8K"}),
       ("gdn_chunk", {"B": 1, "L": 8192, "hk": 16, "hv": 48, "label": "27B 8K"}),
       ("gdn_rec", {"B": 8, "L": 1, "hk": 16, "hv": 48, "label": "27B decode B=8"})]
)


def model_step(preset: str, tokens: int, batch: int, ctx: int) -> list[tuple[str, dict, int]]:
    """(op, shape, calls) of one forward step of a preset: ``batch`` sequences of ``tokens`` new tokens each after
    ``ctx - tokens`` cached ones. The linears of each layer as the checkpoint lists them (tiny router / b / a
    projections and the lm_head, a dense cuBLAS matmul, left out: the table says so)."""
    from catengine.tools.random_checkpoint import build_config
    t = build_config(preset)["text_config"]
    m = tokens * batch
    h = t["hidden_size"]
    kinds = t["layer_types"]
    n_attn = sum(k == "full_attention" for k in kinds)
    n_lin = len(kinds) - n_attn
    nh, nkv, d = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    key_dim, val_dim = hk * 128, hv * 128
    out = []

    def lin(k, n, calls, tag):
        out.append(("w4a16", {"M": m, "K": k, "N": n, "label": f"{tag} M={m} {k}->{n}"}, calls))
    lin(h, 2 * key_dim + val_dim, n_lin, "gdn qkv")
    lin(h, val_dim, n_lin, "gdn z")
    lin(val_dim, h, n_lin, "gdn out")
    lin(h, 2 * nh * d, n_attn, "q+gate")
    lin(h, 2 * nkv * d, n_attn, "k+v")
    lin(nh * d, h, n_attn, "o")
    layers = len(kinds)
    if t.get("num_experts"):
        e, topk, im, sh = t["num_experts"], t["num_experts_per_tok"], t["moe_intermediate_size"], \
            t["shared_expert_intermediate_size"]
        out.append(("moe", {"T": m, "E": e, "topk": topk, "H": h, "I": im, "label": f"moe T={m}"}, layers))
        lin(h, 2 * sh, layers, "shared gate_up")
        lin(sh, h, layers, "shared down")
    else:
        lin(h, 2 * t["intermediate_size"], layers, "gate_up")
        lin(t["intermediate_size"], h, layers, "down")
    out.append(("attn", {"B": batch, "ctx": ctx, "q": tokens, "nh": nh, "nkv": nkv, "d": d,
                         "label": f"attn B={batch} q={tokens} ctx={ctx}"}, n_attn))
    gdn = "gdn_chunk" if tokens > 1 else "gdn_rec"
    out.append((gdn, {"B": batch, "L": tokens, "hk": hk, "hv": hv, "label": f"{gdn} B={batch} L={tokens}"}, n_lin))
    return out


# ---------------------------------------------------------------- trip counts and DRAM bytes per kernel
def _cdiv(a, b):
    return -(-int(a) // int(b))


def _attn_trips(a: dict, s: dict) -> tuple:
    """Average KV tiles per program: the causal prefill's program i_qt sees ctx + (i_qt + 1) * TOK keys; a
    split decode's program its share of ctx. With TWO_PHASE the last (masked) tile is a loop of its own."""
    bn, tok, nsp = a["BLOCK_N"], a["TOK"], a["NUM_SPLITS"]
    ctx0 = s["ctx"] - s["q"]
    n_qt = _cdiv(s["q"], tok)
    keys = sum(min(ctx0 + (i + 1) * tok, s["ctx"]) for i in range(n_qt)) / n_qt / max(nsp, 1)
    tiles = max(1.0, keys / bn)
    if a.get("TWO_PHASE"):
        last = max(1.0, tok / bn) if s["q"] > 1 else 1.0
        return (max(0.0, tiles - last), last)
    return (tiles,)


TRIPS: dict[str, Callable[[dict, dict], tuple]] = {
    "_w4a16_gemm_kernel": lambda a, s: (_cdiv(a["K"] // a["BK"], a["SPLIT_K"]),),
    "w4a16_gemm_sm70_kernel": lambda a, s: (_cdiv(a["K"] // a["BK"], a["SPLIT_K"]),),
    "w4a16_gemm_mma_kernel": lambda a, s: (_cdiv(a["K"] // a["G"], a["n_split"]),),
    "moe_gemm_mma_kernel": lambda a, s: (a["K"] / a["G"],),
    "w4a16_gemv_kernel": lambda a, s: (_cdiv(a["K"] // (8 * a["R"]), a["n_split"]),),
    "_moe_gemm_kernel": lambda a, s: (a["K"] / a["BK"],),
    "moe_gemm_kernel": lambda a, s: (a["K"] / a["BK"],),
    "moe_gemm_sm70_kernel": lambda a, s: (a["K"] / a["BK"],),
    "_moe_up_row_kernel": lambda a, s: (a["H"] / a["BK"],),
    "moe_up_row_kernel": lambda a, s: (a["H"] / a["BK"],),
    "_moe_down_row_kernel": lambda a, s: (_cdiv(a["TOPK"] * a["I"] // a["BK"], a["SPLIT_K"]),),
    "moe_down_row_kernel": lambda a, s: (_cdiv(a["TOPK"] * a["I"] // a["BK"], a["SPLIT_K"]),),
    "moe_up_decode_kernel": lambda a, s: (_cdiv(a["H"] // (8 * a["R"]), a["n_split"]),),
    "moe_down_decode_kernel": lambda a, s: (_cdiv(a["TOPK"] * (a["I"] // (8 * a["R"])), a["n_split"]),),
    "paged_attn_kernel": lambda a, s: _attn_trips(a, s),
    "paged_attn_sm70_kernel": lambda a, s: _attn_trips(a, s),
    "split_reduce_kernel": lambda a, s: (_cdiv(a["NUM_SPLITS"], a["BLOCK_S"]),),
    "gdn_chunk_h_kernel": lambda a, s: ((a["c_hi"] - a["c_lo"]) / s["B"],),
    "gdn_chunk_h_sm70_kernel": lambda a, s: ((a["c_hi"] - a["c_lo"]) / s["B"],),
    # one loop over dk in KS = min(BK, 32) steps
    "gdn_chunk_o_sm70_kernel": lambda a, s: (a["BK"] / min(a["BK"], 32),),
    "gdn_chunk_scan_kernel": lambda a, s: ((a["c_hi"] - a["c_lo"]) / s["B"],),
    "gdn_chunk_wy_kernel": lambda a, s: (14,),
    # one loop over dk in steps of 32 (the block merges and w, u are unrolled)
    "gdn_chunk_wy_sm70_kernel": lambda a, s: (a["BK"] / 32,),
    "gdn_chunk_inv_kernel": lambda a, s: (14,),
    "gdn_recurrent_kernel": lambda a, s: (s["L"],),
}
# kernels without loops (or with unrolled ones only): their SASS counts once per program as it is
NO_LOOPS = ("splitk_reduce_kernel", "_combine_kernel", "combine_kernel", "_route_kernel", "gdn_chunk_o_kernel", "gdn_gating_kernel",
            "gdn_chunk_offsets_kernel", "store_kv_kernel")


def _moe_bytes(launch, s: dict) -> float:
    """The expert stacks are handed over whole; a step reads only the experts its tokens chose."""
    frac = min(1.0, s.get("touched", s["E"]) / s["E"])
    total = launch.tensor_bytes()
    stacks = sum(launch.args[n].nbytes for n in ("w_ptr", "qw_ptr", "s_ptr", "z_ptr") if n in launch.args
                 and hasattr(launch.args[n], "nbytes"))
    return total - stacks * (1 - frac)


# tensors a windowed GDN launch reads or writes whole (per sequence or per launch); the others hold one row per token
# or per chunk, of which a window of chunks [c_lo, c_hi) touches its share
_GDN_WHOLE = ("ssm", "qsl", "cu_chunks", "state_slots", "has_init")


def _gdn_window_bytes(launch, s: dict) -> float:
    """The chunked prefill cuts its chunks into windows (chunk.py's overlap) and hands every window's launch the
    whole tensors: counted whole, the state stage's 200 MB of chunk states would be read once per window."""
    nt = s["B"] * _cdiv(s["L"], 64)
    a = launch.args
    chunks = a["c_hi"] - a["c_lo"] if "c_hi" in a else launch.grid[0]
    frac = min(1.0, chunks / max(nt, 1))
    seen = {}
    for name, v in a.items():
        if hasattr(v, "nbytes") and hasattr(v, "ptr"):
            seen[v.ptr] = max(seen.get(v.ptr, 0.0), v.nbytes * (1.0 if name in _GDN_WHOLE else frac))
    return sum(seen.values())


DRAM: dict[str, Callable] = {k: _gdn_window_bytes for k in (
    "gdn_chunk_wy_kernel", "gdn_chunk_wy_sm70_kernel", "gdn_chunk_inv_kernel", "gdn_chunk_h_kernel", "gdn_chunk_h_sm70_kernel", "gdn_chunk_o_kernel",
    "gdn_chunk_o_sm70_kernel", "gdn_chunk_scan_kernel")}
DRAM.update({k: _moe_bytes for k in (
    "_moe_gemm_kernel", "moe_gemm_kernel", "moe_gemm_sm70_kernel", "_moe_up_row_kernel", "moe_up_row_kernel",
    "_moe_down_row_kernel", "moe_down_row_kernel", "moe_up_decode_kernel", "moe_down_decode_kernel")})


def trips_of(launch, shape: dict) -> tuple[tuple, bool]:
    """(trips, modelled): modelled is False for a kernel with neither a TRIPS line nor a NO_LOOPS entry."""
    fn = TRIPS.get(launch.kernel)
    if fn is not None:
        return tuple(float(x) for x in fn(launch.args, shape)), True
    return (), launch.kernel in NO_LOOPS


def dram_bytes(launch, shape: dict) -> float:
    fn = DRAM.get(launch.kernel)
    return float(fn(launch, shape) if fn else launch.tensor_bytes())


__all__ = ["DRAM", "HMMA_SWITCHES", "HMMA_TABLES", "KERNEL_SHAPES", "NO_LOOPS", "OPS", "Op", "TRIPS", "dram_bytes", "fma_path",
           "model_step", "trips_of"]
