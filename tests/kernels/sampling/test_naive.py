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


def test_only_rows_with_top_k_or_top_p_sort(monkeypatch):
    """One sampled row in a greedy batch must not make every row sort the vocabulary (the CPU path);
    each row still draws what it draws alone."""
    B, V = 12, 2048
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(0))
    temperature, top_k = torch.zeros(B), torch.zeros(B, dtype=torch.int32)
    top_p, min_p = torch.ones(B), torch.zeros(B)
    temperature[3], top_k[3] = 0.8, 20                    # sampled, top-k: needs the order
    temperature[7], min_p[7] = 1.0, 0.05                  # sampled, min-p only: no order needed
    temperature[9], top_p[9] = 0.7, 0.9                   # sampled, top-p: needs the order
    seeds, steps = torch.arange(B) * 11, torch.arange(B)
    sorted_rows = []
    real_sort = torch.Tensor.sort

    def spy(self, *args, **kwargs):
        sorted_rows.append(self.shape[0])
        return real_sort(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", spy)
    out = R.sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, steps)
    assert sorted_rows == [2]
    monkeypatch.setattr(torch.Tensor, "sort", real_sort)
    for b in range(B):
        s = slice(b, b + 1)
        alone = R.sample_tokens(logits[s], temperature[s], top_k[s], top_p[s], min_p[s], seeds[s], steps[s])
        assert out[b] == alone[0]
    assert (out[temperature == 0] == logits[temperature == 0].argmax(-1)).all()
