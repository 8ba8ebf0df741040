"""The torch e5m2 conversions (the oracle of the Triton helpers in common/e5m2_jit.py) against torch's own
float8_e5m2."""
import torch

from catengine.kernels.common import e5m2 as R


def test_e5m2_bytes_match_torch_on_all_fp16_patterns():
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    ours = R.fp16_to_e5m2(x)
    theirs = x.to(torch.float8_e5m2).view(torch.uint8)
    assert torch.equal(ours, theirs)


def test_e5m2_widening_is_exact():
    b = torch.arange(256, dtype=torch.uint8)
    ours = R.e5m2_to_fp16(b)
    theirs = b.view(torch.float8_e5m2).to(torch.float16)
    finite = ~theirs.isnan()
    assert torch.equal(ours[finite].view(torch.int16), theirs[finite].view(torch.int16))
    assert ours[~finite].isnan().all()
