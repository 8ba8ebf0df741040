"""paged_attention (Triton) against its twin (naive.paged_attention).

Caches are poisoned with NaN everywhere a kernel must not read: unused blocks, table entries past a
sequence's last block, and the slots after seq_len in a partial last block; a stray read turns the
output NaN. Tolerance: the twin is fp32 throughout; the kernel rounds the softmax weights to the dot
dtype before P @ V (relative 2^-11 for fp16, 2^-8 for bf16 per term, averaging out over keys) and
rounds the output once, so errors stay within a few units of the output dtype's last place."""
import dataclasses
import re

import pytest
import torch
import triton
import triton.language as tl

from catengine.kernels.attention import naive as ref
from catengine.kernels.attention.paged import AttnLaunch, paged_attention_with, table_launch
from catengine.kernels.common.arch import arch_of
from catengine.kernels.common.e5m2 import e5m2_to_fp16, fp16_to_e5m2
from catengine.kernels.common.e5m2_jit import E5M2_EVEN_PTX, E5M2_ODD_PTX, e5m2_pair

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}
POISON = float("nan")


def make_case(q_lens, seq_lens, nh, nkv, d, bs, kv_dtype, dtype=torch.float16, gen=None, spare_blocks=3):
    """Random q/caches with shuffled, non-contiguous block tables padded with a poison block id."""
    gen = gen or torch.Generator().manual_seed(0)
    need = [(s + bs - 1) // bs for s in seq_lens]
    nblk = sum(need) + spare_blocks
    perm = torch.randperm(nblk, generator=gen).tolist()
    poison_blk = perm[-1]
    width = max(need) + 2
    tables = torch.full((len(seq_lens), width), poison_blk, dtype=torch.int32)
    k = torch.full((nblk, bs, nkv, d), POISON)
    v = torch.full((nblk, bs, nkv, d), POISON)
    i = 0
    for b, (n, s) in enumerate(zip(need, seq_lens)):
        blocks = perm[i:i + n]
        i += n
        tables[b, :n] = torch.tensor(blocks, dtype=torch.int32)
        for j, blk in enumerate(blocks):
            used = min(bs, s - j * bs)  # the rest of a partial last block stays NaN
            k[blk, :used] = torch.randn(used, nkv, d, generator=gen)
            v[blk, :used] = torch.randn(used, nkv, d, generator=gen)
    if kv_dtype == torch.uint8:
        k, v = fp16_to_e5m2(k.half()), fp16_to_e5m2(v.half())
    else:
        k, v = k.to(kv_dtype), v.to(kv_dtype)
    t = sum(q_lens)
    qg = torch.randn(t, nh, 2 * d, generator=gen).to(dtype)  # per-head [q | gate], as q_proj lays it out
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    return dict(q=qg[..., :d], gate=qg[..., d:], k_cache=k, v_cache=v, block_tables=tables,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_start_loc=qsl,
                max_query_len=max(q_lens), max_seq_len=max(seq_lens))


def run_both(case, gated=True, **kw):
    args = dict(case)
    gate = args.pop("gate") if gated else None
    args.pop("gate", None)
    scale = case["q"].shape[-1] ** -0.5
    dev = {k: (v.to(DEV) if torch.is_tensor(v) else v) for k, v in args.items()}
    want = ref.paged_attention(dev["q"], dev["k_cache"], dev["v_cache"], dev["block_tables"], dev["seq_lens"],
                               dev["query_start_loc"], scale, dev["max_query_len"], dev["max_seq_len"],
                               None if gate is None else gate.to(DEV)).cpu()
    got = paged_attention_with(dev["q"], dev["k_cache"], dev["v_cache"], dev["block_tables"], dev["seq_lens"],
                               dev["query_start_loc"], scale, dev["max_query_len"], dev["max_seq_len"],
                               None if gate is None else gate.to(DEV), **kw)
    return got.cpu(), want


def assert_close(got, want, dtype):
    assert torch.isfinite(got.float()).all(), "NaN/inf: the kernel read a poisoned (unowned) cache slot"
    err = (got.float() - want.float()).abs().max().item()
    assert err <= TOL[dtype], f"max abs error {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.uint8], ids=["fp16", "e5m2"])
@pytest.mark.parametrize("nh,nkv,splits", [(6, 2, None), (6, 2, 3), (6, 2, 9), (4, 4, 3), (8, 1, None), (8, 1, 9)])
def test_decode(kv_dtype, nh, nkv, splits):
    case = make_case([1, 1, 1, 1], [1, 5, 70, 17], nh, nkv, 64, 4, kv_dtype,
                     gen=torch.Generator().manual_seed(nh * 7 + nkv))
    got, want = run_both(case, num_splits=splits)  # 9 splits: most are empty and must be neutral
    assert_close(got, want, torch.float16)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.uint8], ids=["fp16", "e5m2"])
def test_speculative_verify(kv_dtype):
    """A few new tokens per sequence (and one sequence with none) through the split decode launch."""
    case = make_case([3, 1, 0, 4, 2], [9, 30, 12, 4, 66], 6, 2, 64, 8, kv_dtype,
                     gen=torch.Generator().manual_seed(3))
    got, want = run_both(case, num_splits=2)
    assert_close(got, want, torch.float16)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.uint8], ids=["fp16", "e5m2"])
@pytest.mark.parametrize("nh,nkv,bs", [(6, 2, 4), (4, 1, 16), (3, 3, 5)])
def test_prefill_with_cached_context(kv_dtype, nh, nkv, bs):
    """Chunked prefill and prefix hits: new queries continue a cached context; one sequence is decode."""
    case = make_case([20, 9, 1, 33, 0], [20, 45, 17, 50, 8], nh, nkv, 64, bs, kv_dtype,
                     gen=torch.Generator().manual_seed(nh + bs))
    got, want = run_both(case, gated=nh != 4)
    assert_close(got, want, torch.float16)


@pytest.mark.parametrize("arch", [70, 80, 90])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_every_table_row(arch, d):
    """Each (arch, head_dim) row of both tables computes the right thing (interpreter)."""
    q_lens, seq_lens = ([12, 1, 7], [30, 9, 7]) if d != 256 else ([5, 1], [21, 6])
    case = make_case(q_lens, seq_lens, 6, 2, d, 8, torch.float16, gen=torch.Generator().manual_seed(d + arch))
    got, want = run_both(case, arch=arch)
    assert_close(got, want, torch.float16)
    dec = make_case([1, 2], [37, 19], 6, 2, d, 8, torch.uint8, gen=torch.Generator().manual_seed(d))
    got, want = run_both(dec, arch=arch, num_splits=2)
    assert_close(got, want, torch.float16)


@pytest.mark.parametrize("two_phase", [False, True])
def test_small_tiles_both_loop_shapes(two_phase):
    case = make_case([17, 3], [40, 3], 6, 2, 64, 4, torch.float16, gen=torch.Generator().manual_seed(8))
    got, want = run_both(case, cfg=AttnLaunch(32, 16, 4, 1, two_phase))
    assert_close(got, want, torch.float16)


@pytest.mark.parametrize("two_phase,widen_asm", [(False, False), (True, True)])
def test_blocks_larger_than_key_tile(two_phase, widen_asm):
    """Block size 32 over 16-key tiles (a tile inside one block); widen_asm falls back to the shifts in
    the interpreter and must give the same result."""
    case = make_case([1, 5, 1], [70, 40, 33], 6, 2, 64, 32, torch.uint8, gen=torch.Generator().manual_seed(5))
    got, want = run_both(case, num_splits=3, cfg=AttnLaunch(16, 16, 4, 1, two_phase, 2, widen_asm))
    assert_close(got, want, torch.float16)


# ----------------------------------------------------------------------------- e5m2 widening
@triton.jit
def _widen_kernel(x, lo, hi, ASM: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # [BLOCK]
    b_x = tl.load(x + o)
    b_lo, b_hi = e5m2_pair(b_x, tl.float16, ASM)
    tl.store(lo + o, b_lo)
    tl.store(hi + o, b_hi)


def widen_all_words(asm: bool, device: str):
    """Every int16 word (every e5m2 byte in both halves) through e5m2_pair -> (even, odd) fp16 bits."""
    words = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).to(device)
    lo, hi = torch.empty(65536, dtype=torch.float16, device=device), torch.empty(65536, dtype=torch.float16,
                                                                                 device=device)
    _widen_kernel[(65536 // 1024,)](words, lo, hi, ASM=asm, BLOCK=1024)
    return words.cpu(), lo.cpu().view(torch.int16), hi.cpu().view(torch.int16)


def want_widened(words):
    b = words.view(torch.uint8).view(-1, 2)  # little-endian: byte 0 is the even element
    return (e5m2_to_fp16(b[:, 0].contiguous()).view(torch.int16),
            e5m2_to_fp16(b[:, 1].contiguous()).view(torch.int16))


def test_e5m2_widen_all_bytes():
    """The shift widening (the interpreter's and the default) is the twin's, bit for bit."""
    words, lo, hi = widen_all_words(False, DEV)
    want_lo, want_hi = want_widened(words)
    assert torch.equal(lo, want_lo) and torch.equal(hi, want_hi)


def _run_ptx(asm: str, reg: int) -> int:
    """The two PTX instructions the widening uses, on one 32-bit register (PTX ISA semantics of prmt's
    default mode: byte i of d = byte sel[4i+3:4i] of {b, a}, bit 3 of a selector replicates the sign)."""
    op, args = asm.strip().rstrip(";").split(None, 1)
    d, *src = [a.strip() for a in args.split(",")]
    assert d == "$0", asm
    val = [reg if a == "$1" else int(a, 0) for a in src]
    if op == "and.b32":
        return val[0] & val[1]
    assert op == "prmt.b32", asm
    pool = (val[1] & 0xFFFFFFFF) << 32 | (val[0] & 0xFFFFFFFF)
    out = 0
    for i in range(4):
        sel = (val[2] >> 4 * i) & 0xF
        byte = (pool >> 8 * (sel & 7)) & 0xFF
        out |= ((0xFF if byte & 0x80 else 0) if sel & 8 else byte) << 8 * i
    return out


def test_e5m2_widen_ptx_constants():
    """The inline PTX (run only on a GPU) emulated on registers holding two words, covering every byte
    value in every position: it must equal the shift widening. The GPU test runs the real thing."""
    for asm in (E5M2_EVEN_PTX.value, E5M2_ODD_PTX.value):
        assert re.fullmatch(r"(prmt|and)\.b32 \$0, \$1, [0-9a-fA-Fx]+(, 0x[0-9a-fA-F]+)?;", asm), asm
    gen = torch.Generator().manual_seed(0)
    w0 = torch.arange(65536, dtype=torch.int64)
    w1 = torch.randint(0, 65536, (65536,), generator=gen, dtype=torch.int64)
    regs = (w0 | w1 << 16).tolist()
    want = [want_widened(w.to(torch.int32).to(torch.int16)) for w in (w0, w1)]
    for out, asm in ((0, E5M2_EVEN_PTX.value), (1, E5M2_ODD_PTX.value)):
        got = torch.tensor([_run_ptx(asm, r) for r in regs], dtype=torch.int64)
        assert torch.equal((got & 0xFFFF).to(torch.int32).to(torch.int16), want[0][out]), asm
        assert torch.equal((got >> 16).to(torch.int32).to(torch.int16), want[1][out]), asm


@pytest.mark.gpu
def test_gpu_e5m2_widen_ptx_bits():
    """The inline-PTX widening, compiled, equals the twin on every int16 word."""
    words, lo, hi = widen_all_words(True, "cuda")
    want_lo, want_hi = want_widened(words)
    assert torch.equal(lo, want_lo) and torch.equal(hi, want_hi)


@pytest.mark.gpu  # the Triton 3.9 interpreter multiplies bf16 dot operands as raw uint16 bits
def test_bf16_small():
    case = make_case([17, 3, 1], [40, 3, 9], 6, 2, 64, 4, torch.bfloat16, dtype=torch.bfloat16,
                     gen=torch.Generator().manual_seed(8))
    got, want = run_both(case)
    assert_close(got, want, torch.bfloat16)


# ----------------------------------------------------------------------------- GPU, real shapes
QWEN27B = dict(nh=24, nkv=4, d=256)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.uint8, torch.bfloat16], ids=["fp16", "e5m2", "bf16"])
@pytest.mark.parametrize("q_len", [1, 4])
def test_gpu_decode_real_shape(kv_dtype, q_len):
    dtype = torch.bfloat16 if kv_dtype == torch.bfloat16 else torch.float16
    seq = [33000, 700, 5, 9000, 16, 130, 4100, 2]
    case = make_case([min(q_len, s) for s in seq], seq, bs=16, kv_dtype=kv_dtype, dtype=dtype,
                     gen=torch.Generator().manual_seed(q_len), **QWEN27B)
    got, want = run_both(case)
    assert_close(got, want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.uint8], ids=["fp16", "e5m2"])
@pytest.mark.parametrize("cfg", [AttnLaunch(16, 32, 8, 5, False, 2), AttnLaunch(16, 32, 4, 5, True, 3),
                                 AttnLaunch(16, 64, 8, 5, False, 1)], ids=str)
def test_gpu_decode_launch_candidates(kv_dtype, cfg):
    """Decode launches the benchmark's sweep compares (deeper pipelines, both loop shapes), real shape."""
    seq = [33000, 700, 5, 9000, 16, 130, 4100, 2]
    case = make_case([min(2, s) for s in seq], seq, bs=16, kv_dtype=kv_dtype,
                     gen=torch.Generator().manual_seed(11), **QWEN27B)
    got, want = run_both(case, cfg=cfg)
    assert_close(got, want, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("cfg", [AttnLaunch(16, 128, 4, 3, False, 2, True), AttnLaunch(16, 64, 4, 5, False, 2, True),
                                 AttnLaunch(16, 128, 4, 3, True, 2, True), AttnLaunch(16, 64, 4, 5, True, 2, True),
                                 AttnLaunch(16, 32, 4, 5, False, 3, True)], ids=str)
def test_gpu_decode_widen_asm(cfg, q_len):
    """e5m2 decode with the inline-PTX widening (the sweep's candidates), real shape, ragged contexts that
    end mid-block and mid-tile, against the twin."""
    seq = [33000, 700, 5, 9000, 16, 130, 4100, 2]
    case = make_case([min(q_len, s) for s in seq], seq, bs=16, kv_dtype=torch.uint8,
                     gen=torch.Generator().manual_seed(13 + q_len), **QWEN27B)
    got, want = run_both(case, cfg=cfg)
    assert_close(got, want, torch.float16)


@pytest.mark.gpu
def test_gpu_prefill_widen_asm():
    """The prefill row of this GPU with the inline-PTX widening (the sweep times it), e5m2, real shape."""
    cfg = dataclasses.replace(table_launch(arch_of(torch.device("cuda")), 256, False, True), widen_asm=True)
    case = make_case([2000, 1, 517, 64], [3000, 900, 517, 2100], bs=16, kv_dtype=torch.uint8,
                     gen=torch.Generator().manual_seed(7), **QWEN27B)
    got, want = run_both(case, cfg=cfg)
    assert_close(got, want, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.uint8, torch.bfloat16], ids=["fp16", "e5m2", "bf16"])
def test_gpu_prefill_real_shape(kv_dtype):
    dtype = torch.bfloat16 if kv_dtype == torch.bfloat16 else torch.float16
    case = make_case([2000, 1, 517, 64], [3000, 900, 517, 2100], bs=16, kv_dtype=kv_dtype, dtype=dtype,
                     gen=torch.Generator().manual_seed(7), **QWEN27B)
    got, want = run_both(case)
    assert_close(got, want, dtype)


@pytest.mark.gpu
def test_gpu_decode_graph_capture():
    """Decode launches no host sync: it captures into a CUDA graph and replays to the same result."""
    case = make_case([1] * 4, [5000, 17, 800, 12000], bs=16, kv_dtype=torch.float16,
                     gen=torch.Generator().manual_seed(1), **QWEN27B)
    dev = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in case.items()}
    scale = 256 ** -0.5

    def call():
        return paged_attention_with(dev["q"], dev["k_cache"], dev["v_cache"], dev["block_tables"], dev["seq_lens"],
                                    dev["query_start_loc"], scale, 1, 12000, dev["gate"])
    first = call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)
