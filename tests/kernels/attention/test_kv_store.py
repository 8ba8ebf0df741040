"""store_kv (Triton) against its twin (naive.store_kv): interpreter on tiny shapes, compiled with -m gpu."""
import pytest
import torch

from catengine.kernels.attention import naive as ref
from catengine.kernels.attention.kv_store import store_kv
from catengine.kernels.common.e5m2 import e5m2_to_fp16, fp16_to_e5m2

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(t, nkv, d, nb, bs, in_dtype, cache_dtype, gen, strided=False, holes=True):
    if strided:  # key/value as views of a wider projection output (head stride > d)
        key = torch.randn(t, nkv, 2 * d, generator=gen).to(in_dtype)[..., :d]
        value = torch.randn(t, nkv, 2 * d, generator=gen).to(in_dtype)[..., d:]
    else:
        key = torch.randn(t, nkv, d, generator=gen).to(in_dtype)
        value = torch.randn(t, nkv, d, generator=gen).to(in_dtype)
    slots = torch.randperm(nb * bs, generator=gen)[:t].to(torch.int64)
    if holes:
        slots[::3] = -1  # padding tokens: must leave the cache untouched
    fill = torch.randn(nb, bs, nkv, d, generator=gen)
    k_cache = ref.to_cache(fill, cache_dtype) if cache_dtype == torch.uint8 else fill.to(cache_dtype)
    v_cache = k_cache.clone()
    return key, value, k_cache, v_cache, slots


@pytest.mark.parametrize("in_dtype,cache_dtype", [
    (torch.float16, torch.float16), (torch.float16, torch.uint8), (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.uint8), (torch.float32, torch.uint8)])
@pytest.mark.parametrize("nkv,d,bs,strided", [(1, 64, 4, False), (3, 32, 16, True), (4, 16, 5, False)])
def test_store_kv_matches_reference(in_dtype, cache_dtype, nkv, d, bs, strided):
    gen = torch.Generator().manual_seed(nkv * 100 + d + bs)
    key, value, kc, vc, slots = _case(11, nkv, d, 6, bs, in_dtype, cache_dtype, gen, strided)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref.store_kv(key, value, kc_ref, vc_ref, slots)
    kc_d, vc_d = kc.clone().to(DEV), vc.clone().to(DEV)
    store_kv(key.to(DEV), value.to(DEV), kc_d, vc_d, slots.to(DEV))
    assert torch.equal(kc_d.cpu().view(torch.uint8), kc_ref.view(torch.uint8))
    assert torch.equal(vc_d.cpu().view(torch.uint8), vc_ref.view(torch.uint8))
    assert not torch.equal(kc_ref.view(torch.uint8), kc.view(torch.uint8)), "the case must write something"


def _all_fp16_patterns():
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)


def test_e5m2_all_fp16_patterns_bit_exact():
    """Every fp16 bit pattern (NaNs, infs, subnormals, both zeros) through the Triton store kernel
    equals the integer twin and torch's own float8_e5m2 cast (NaN: torch keeps a NaN, we write the
    canonical 0x7F|sign, which is also what torch produces)."""
    x = _all_fp16_patterns().view(16, 16, 256)  # 16 tokens of 16 heads: few interpreter programs
    slots = torch.arange(16, dtype=torch.int64).flip(0)
    kc = torch.zeros(2, 8, 16, 256, dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    kc_d, vc_d = kc.to(DEV), vc.to(DEV)
    store_kv(x.to(DEV), (-x).to(DEV), kc_d, vc_d, slots.to(DEV))
    got_k, got_v = kc_d.cpu().reshape(16, -1).flip(0).reshape(-1), vc_d.cpu().reshape(16, -1).flip(0).reshape(-1)
    flat = x.reshape(-1)
    assert torch.equal(got_k, fp16_to_e5m2(flat))
    assert torch.equal(got_v, fp16_to_e5m2(-flat))
    torch_bytes = flat.to(torch.float8_e5m2).view(torch.uint8)
    nan = flat.isnan()
    assert torch.equal(got_k[~nan], torch_bytes[~nan])
    assert ((got_k[nan] & 0x7F) == 0x7F).all() and torch.equal(got_k[nan] >> 7, torch_bytes[nan] >> 7)
    # widening back is exact for every non-NaN byte
    assert torch.equal(e5m2_to_fp16(got_k)[~nan].float(), flat.to(torch.float8_e5m2).float()[~nan])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float16, torch.float16), (torch.float16, torch.uint8),
                                               (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.uint8)])
def test_store_kv_gpu_real_shape(dtype, cache_dtype):
    gen = torch.Generator().manual_seed(0)
    key, value, kc, vc, slots = _case(4096, 4, 256, 300, 16, dtype, cache_dtype, gen, strided=True)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref.store_kv(key, value, kc_ref, vc_ref, slots)
    kc_d, vc_d = kc.cuda(), vc.cuda()
    store_kv(key.cuda(), value.cuda(), kc_d, vc_d, slots.cuda())
    assert torch.equal(kc_d.cpu().view(torch.uint8), kc_ref.view(torch.uint8))
    assert torch.equal(vc_d.cpu().view(torch.uint8), vc_ref.view(torch.uint8))
