"""The sampler twin itself: greedy rows and the kept set of top-k (it is the oracle for the kernel)."""
import torch

from catengine.kernels.sampling import naive as R


def test_sampler_greedy_and_kept_set():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 4.9]])
    ones = torch.ones(2)
    greedy = R.sample_tokens(logits, torch.zeros(2), torch.zeros(2, dtype=torch.int32), ones, torch.zeros(2),
                             torch.tensor([1, 2]), torch.tensor([0, 0]))
    assert greedy.tolist() == [1, 0]
    for step in range(50):  # top_k = 2 only ever returns the two best tokens
        t = R.sample_tokens(logits, ones, torch.tensor([2, 2], dtype=torch.int32), ones, torch.zeros(2),
                            torch.tensor([7, 7]), torch.tensor([step, step]))
        assert t[0].item() in (1, 3) and t[1].item() in (0, 3)
