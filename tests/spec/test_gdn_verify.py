"""The conv windows a verify step saves per token equal the windows decoding those tokens one at a time leaves."""
import torch

from catengine.kernels.gdn import naive
from catengine.models.gdn_verify import conv_windows_before, save_conv_windows


def test_conv_windows_match_token_by_token_decode():
    g = torch.Generator().manual_seed(0)
    kc, c, slots = 4, 6, 12
    lens = [3, 1, 5, 2]                      # verify rows of different lengths, one plain decode row
    conv = torch.randn(slots, kc - 1, c, generator=g)
    weight = torch.randn(c, kc, generator=g)
    x = torch.randn(sum(lens), c, generator=g)
    live = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    has = torch.tensor([True, True, True, False])
    qsl = torch.tensor([0, 3, 4, 9, 11], dtype=torch.int32)
    inter = torch.full((4, 5), -1, dtype=torch.int32)
    inter[0, :3] = torch.tensor([4, 5, 0])
    inter[2, :5] = torch.tensor([6, 7, 8, 9, 2])
    inter[3, :2] = torch.tensor([10, 11])   # no initial state: the window starts from zeros

    ref = conv.clone()
    want = {}
    for b, (s0, n) in enumerate(zip(qsl[:-1].tolist(), lens)):
        state = ref[live[b]].clone() if has[b] else torch.zeros(kc - 1, c)
        for j in range(n):
            one = torch.stack([state])
            naive.causal_conv1d_update(x[s0 + j:s0 + j + 1], weight, one, torch.zeros(1, dtype=torch.int32))
            state = one[0]
            if inter[b, j] >= 0:
                want[int(inter[b, j])] = state.clone()

    got = conv.clone()
    init = conv_windows_before(got, live, has)
    naive.causal_conv1d(x, weight, got, qsl, live, has)
    save_conv_windows(x, init, got, qsl, inter)
    for slot, window in want.items():
        torch.testing.assert_close(got[slot], window, rtol=0, atol=0)
    untouched = set(range(slots)) - set(want) - set(live.tolist())
    for slot in untouched:
        assert torch.equal(got[slot], conv[slot])
