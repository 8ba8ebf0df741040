"""The flat batch (runner -> model contract) and the caches the model reads and writes.

A step runs T new tokens of B sequences in one call. Sequence b owns tokens
``query_start_loc[b] : query_start_loc[b+1]`` of ``input_ids``/``positions``; they continue
``seq_lens[b] - q_len_b`` tokens already cached. Prefill chunks, decode tokens and (later)
speculative tokens of different sequences mix freely.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchMetadata:
    query_start_loc: torch.Tensor    # [B+1] int32, cumulative new-token counts
    seq_lens: torch.Tensor           # [B] int32, cached + new tokens
    block_tables: torch.Tensor       # [B, max_blocks] int32, KV block ids per sequence
    slot_mapping: torch.Tensor       # [T] int64, where each new token's K/V goes (-1 = nowhere)
    state_slots: torch.Tensor        # [B] int32, GDN state slot of each sequence
    has_initial_state: torch.Tensor  # [B] bool, False: start GDN state from zeros
    max_query_len: int               # host-side max of the new-token counts
    max_seq_len: int                 # host-side max of seq_lens
    # [B, max_query_len] int32 or None: write the GDN state after each new token to its own slot
    # (speculative verification rolls back to one of them); -1 = do not save.
    intermediate_state_slots: torch.Tensor | None = None
    # the same, flattened to its saved entries (b * max_query_len + j, slot), built on the host by the runner so
    # the conv windows are written without a device-to-host sync in every GDN layer; None: derived from the above
    intermediate_targets: tuple[torch.Tensor, torch.Tensor] | None = None
    # host-side: every sequence brings exactly one new token and continues a saved GDN state, so the
    # GDN layers may take the single-step conv update and the recurrent rule
    decode_only: bool = False

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @classmethod
    def build(cls, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
              block_size: int, state_slots: list[int], device="cpu") -> "BatchMetadata":
        """Host-side convenience used by tests and the runner: derives positions-independent fields.
        Sequence b has ``seq_lens[b] - query_lens[b]`` cached tokens; its new tokens go to the
        slots that follow them in its block table."""
        qsl = [0]
        slots: list[int] = []
        for ql, sl, table in zip(query_lens, seq_lens, block_tables):
            qsl.append(qsl[-1] + ql)
            for pos in range(sl - ql, sl):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=0) or 1
        tables = torch.zeros((len(block_tables), width), dtype=torch.int32)
        for i, t in enumerate(block_tables):
            tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        return cls(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=tables.to(device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            state_slots=torch.tensor(state_slots, dtype=torch.int32, device=device),
            has_initial_state=torch.tensor([s > q for q, s in zip(query_lens, seq_lens)], dtype=torch.bool,
                                           device=device),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            decode_only=bool(query_lens) and all(q == 1 and s > 1 for q, s in zip(query_lens, seq_lens)),
        )

    @staticmethod
    def positions(query_lens: list[int], seq_lens: list[int], device="cpu") -> torch.Tensor:
        """[T] int64 positions of the new tokens."""
        return torch.cat([torch.arange(s - q, s, dtype=torch.int64) for q, s in zip(query_lens, seq_lens)]
                         or [torch.zeros(0, dtype=torch.int64)]).to(device)


@dataclass
class AttentionCache:
    """Paged K/V of one full-attention layer: [num_blocks, block_size, nkv, d] each, the model dtype
    or uint8 holding fp8 e5m2 bytes."""
    k: torch.Tensor
    v: torch.Tensor


@dataclass
class GDNStateCache:
    """State slots of one Gated DeltaNet layer: conv [num_slots, Kc-1, conv_dim] (model dtype) and
    recurrent ssm [num_slots, Hv, dk, dv] in EngineConfig.mamba_ssm_cache_dtype (the model dtype by default)."""
    conv: torch.Tensor
    ssm: torch.Tensor


@dataclass
class ModelCaches:
    """Per-layer caches indexed by decoder-layer id (MTP layers follow the decoder layers)."""
    layers: list
    num_blocks: int
    block_size: int
    num_state_slots: int

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy KV blocks ``src -> dst`` in every attention layer (copy-on-write of a shared last block)."""
        if not copies:
            return
        device = next((layer.k.device for layer in self.layers if isinstance(layer, AttentionCache)), None)
        if device is None:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.int64, device=device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.int64, device=device)
        for layer in self.layers:
            if isinstance(layer, AttentionCache):
                layer.k[dst] = layer.k[src]
                layer.v[dst] = layer.v[src]

    def copy_state_slot(self, src: int, dst: int) -> None:
        """Copy every GDN layer's conv and recurrent state from slot ``src`` to slot ``dst`` (prefix-cache
        snapshots and speculative rollback)."""
        for layer in self.layers:
            if isinstance(layer, GDNStateCache):
                layer.conv[dst].copy_(layer.conv[src])
                layer.ssm[dst].copy_(layer.ssm[src])


def resolve_placeholders(input_ids: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
    """``input_ids`` with each placeholder ``-1 - row`` replaced by ``prev_tokens[row]``, on the device (async
    scheduling: the host scheduled this step before the previous one's tokens came back)."""
    if prev_tokens.numel() == 0:
        return input_ids
    return torch.where(input_ids < 0, prev_tokens[(-1 - input_ids).clamp_(min=0)], input_ids)
