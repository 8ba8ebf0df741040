"""The W4A16 weight format: int4 packing along K round-trips and dequantises as (q - z) * s."""
import torch

from catengine.kernels.w4a16.packing import QuantizedWeight, dequantize, pack_int4_along_k, unpack_int4_along_k


def test_int4_packing_round_trips_and_dequantizes():
    g = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (2, 64, 24), generator=g)
    packed = pack_int4_along_k(q)
    assert packed.shape == (2, 8, 24) and packed.dtype == torch.int32
    assert torch.equal(unpack_int4_along_k(packed), q.to(torch.int32))
    s, z = torch.rand(2, 2, 24, generator=g), torch.randint(0, 16, (2, 2, 24), generator=g).float()
    w = dequantize(QuantizedWeight(packed, s, z, 32))
    torch.testing.assert_close(w, (q - z.repeat_interleave(32, 1)) * s.repeat_interleave(32, 1))
