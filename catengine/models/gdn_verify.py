"""Speculative verification in a Gated DeltaNet layer: the conv window after every verified token.

The recurrent rule already writes the state after each new token to ``intermediate_state_slots[b, j]``; the
conv state (the last Kc-1 pre-conv inputs) needs the same, so that the sequence can continue from the slot of
its last accepted token with no copy (see docs/architecture.md, "Speculative decoding"). The windows are a few
gathers of data the step already has: the window after token j of sequence b is
``cat(window before the step, x_b)[j+1 : j+Kc]``.
"""
from __future__ import annotations

import torch


def conv_windows_before(conv_states: torch.Tensor, state_slots: torch.Tensor,
                        has_initial_state: torch.Tensor) -> torch.Tensor:
    """[B, Kc-1, C]: each sequence's conv window before the step (zeros without an initial state); read
    before the conv overwrites the live slots."""
    init = conv_states.index_select(0, state_slots.to(torch.int64))
    return init * has_initial_state.to(init.dtype)[:, None, None]


def save_conv_windows(x: torch.Tensor, init: torch.Tensor, conv_states: torch.Tensor, query_start_loc: torch.Tensor,
                      intermediate_state_slots: torch.Tensor, targets=None) -> None:
    """Write the window after each new token j of sequence b to ``conv_states[intermediate_state_slots[b, j]]``
    (negative: skip). x: [T, C] the pre-conv inputs of the step; init: [B, Kc-1, C] from conv_windows_before;
    targets: (flat b * Q + j, slot) of the saved entries (BatchMetadata.intermediate_targets), else derived here
    (a host sync)."""
    b, q = intermediate_state_slots.shape
    w = init.shape[1]
    t = x.shape[0]
    lens = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
    j = torch.arange(q, device=x.device)
    valid = j[None, :] < lens[:, None]                                              # [B, Q]
    src = (query_start_loc[:-1].to(torch.int64)[:, None] + j[None, :]).clamp(0, max(t - 1, 0))
    rows = x.index_select(0, src.reshape(-1)).view(b, q, -1) if t else x.new_zeros(b, q, x.shape[1])
    padded = torch.cat([init.to(x.dtype), rows], dim=1)                             # [B, Kc-1+Q, C]
    windows = padded.unfold(1, w, 1)[:, 1:q + 1].transpose(2, 3)                    # [B, Q, Kc-1, C]
    if targets is None:
        keep = (valid & (intermediate_state_slots >= 0)).reshape(-1).nonzero().flatten()
        targets = keep, intermediate_state_slots.reshape(-1)[keep].to(torch.int64)
    rows, slots = targets
    conv_states.index_copy_(0, slots, windows.reshape(b * q, w, -1).index_select(0, rows).to(conv_states.dtype))
