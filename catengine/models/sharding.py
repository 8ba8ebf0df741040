"""How a tensor-parallel rank's slice of every weight is cut (Megatron-style column/row parallel).

Column-parallel (split the output dim, no communication): q/k/v (by heads, q with its gate), the GDN
input projections (per q/k/v segment, z, a, b, by heads), conv1d channels, A_log, dt_bias, gate/up (dense
MLP, shared expert, every routed expert by its intermediate dim), embed_tokens and lm_head (by vocab
rows). Row-parallel (split the input dim, then an all-reduce): o_proj, out_proj, down_proj. Replicated:
norms, the router, the shared-expert gate, the MTP fc. KV heads are replicated when there are fewer
than ranks (rank r reads KV head r // (N / nkv)).

Expert parallelism (``expert_parallel``): the routed experts are not cut; rank r holds whole experts
r * E / N .. (r + 1) * E / N - 1 (``expert_range``), the fused stacks are cut along the expert dim and
per-expert tensors of other ranks are not read at all. The shared expert stays column/row parallel.

A :class:`Shard` names ranges along one dim of the tensor as stored densely ([out, in] for a linear;
a quantized linear is cut in the same logical [N, K] coordinates and the loader maps them onto each
format's packed dims).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError
from .model_config import ModelConfig


@dataclass(frozen=True)
class Shard:
    dim: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.ranges)


TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class TPLayout:
    """Rank ``rank``'s share of a model config among ``size`` ranks (``TPLayout.of(cfg)`` for one rank)."""
    cfg: ModelConfig
    rank: int = 0
    size: int = 1
    expert_parallel: bool = False

    @classmethod
    def of(cls, cfg: ModelConfig, rank: int = 0, size: int = 1, expert_parallel: bool = False) -> "TPLayout":
        check_tp_size(cfg, size, expert_parallel)
        return cls(cfg, rank, size, expert_parallel)

    @property
    def expert_range(self) -> tuple[int, int] | None:
        """The routed experts this rank holds whole (expert parallelism at TP > 1), else None."""
        if not self.expert_parallel or self.size == 1:
            return None
        n = self.cfg.num_experts // self.size
        return self.rank * n, (self.rank + 1) * n

    # local sizes -------------------------------------------------------------
    @property
    def nh(self) -> int:
        return self.cfg.num_attention_heads // self.size

    @property
    def nkv(self) -> int:
        return max(1, self.cfg.num_key_value_heads // self.size)

    @property
    def kv_start(self) -> int:
        c = self.cfg
        if c.num_key_value_heads >= self.size:
            return self.rank * self.nkv
        return self.rank // (self.size // c.num_key_value_heads)

    @property
    def hk(self) -> int:
        return self.cfg.linear_num_key_heads // self.size

    @property
    def hv(self) -> int:
        return self.cfg.linear_num_value_heads // self.size

    @property
    def conv_dim(self) -> int:
        c = self.cfg
        return 2 * self.hk * c.linear_key_head_dim + self.hv * c.linear_value_head_dim

    def part(self, total: int) -> tuple[int, int]:
        n = total // self.size
        return self.rank * n, (self.rank + 1) * n

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.cfg.vocab_size // self.size)

    @property
    def vocab_range(self) -> tuple[int, int]:
        n = self.vocab_per_rank
        return min(self.rank * n, self.cfg.vocab_size), min((self.rank + 1) * n, self.cfg.vocab_size)

    # the slice of each tensor ---------------------------------------------------
    def shard(self, name: str) -> Shard | None:
        """This rank's slice of the checkpoint tensor ``name`` (normalized; a quantized module as
        ``<module>.weight``); None when every rank holds all of it."""
        if self.size == 1:
            return None
        c = self.cfg
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return Shard(0, (self.vocab_range,))
        m = re.search(r"\.(self_attn|linear_attn|mlp)\.(.+)$", name)
        if m is None:
            return None
        block, rest = m[1], m[2]
        if block == "self_attn":
            d = c.head_dim
            h0 = self.rank * self.nh
            kv = (self.kv_start * d, (self.kv_start + self.nkv) * d)
            return {"q_proj.weight": Shard(0, ((2 * h0 * d, 2 * (h0 + self.nh) * d),)),
                    "k_proj.weight": Shard(0, (kv,)), "v_proj.weight": Shard(0, (kv,)),
                    "o_proj.weight": Shard(1, ((h0 * d, (h0 + self.nh) * d),))}.get(rest)
        if block == "linear_attn":
            dk, dv, kd = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_key_dim
            k0, v0 = self.rank * self.hk, self.rank * self.hv
            keys = (k0 * dk, (k0 + self.hk) * dk)
            vals = (v0 * dv, (v0 + self.hv) * dv)
            heads = (v0, v0 + self.hv)
            qkv = (keys, (kd + keys[0], kd + keys[1]), (2 * kd + vals[0], 2 * kd + vals[1]))
            return {"in_proj_qkv.weight": Shard(0, qkv), "conv1d.weight": Shard(0, qkv),
                    "in_proj_z.weight": Shard(0, (vals,)), "out_proj.weight": Shard(1, (vals,)),
                    "in_proj_a.weight": Shard(0, (heads,)), "in_proj_b.weight": Shard(0, (heads,)),
                    "A_log": Shard(0, (heads,)), "dt_bias": Shard(0, (heads,))}.get(rest)
        # mlp: dense, shared expert, routed experts (fused on disk or per expert)
        if rest.startswith("shared_expert."):
            inter, rest = c.shared_expert_intermediate_size, rest[len("shared_expert."):]
        elif rest.startswith("experts."):
            if self.expert_range is not None:
                # fused stacks [E, ...] by expert; a per-expert tensor is whole (the loader skips other ranks')
                return Shard(0, (self.expert_range,)) if rest in ("experts.gate_up_proj", "experts.down_proj") \
                    else None
            inter, rest = c.moe_intermediate_size, re.sub(r"^experts\.(\d+\.)?", "", rest)
            i0, i1 = self.part(inter)
            if rest == "gate_up_proj":          # fused [E, 2I, H], gate rows first
                return Shard(1, ((i0, i1), (inter + i0, inter + i1)))
            if rest == "down_proj":             # fused [E, H, I]
                return Shard(2, ((i0, i1),))
        else:
            inter = c.intermediate_size
        i0, i1 = self.part(inter)
        return {"gate_proj.weight": Shard(0, ((i0, i1),)), "up_proj.weight": Shard(0, ((i0, i1),)),
                "down_proj.weight": Shard(1, ((i0, i1),))}.get(rest)


def check_tp_size(cfg: ModelConfig, size: int, expert_parallel: bool = False) -> None:
    """ConfigError naming the dimension when ``size`` ranks cannot split ``cfg``'s heads and widths
    (with ``expert_parallel``: its routed experts, whole)."""
    if size not in TP_SIZES:
        raise ConfigError(f"tensor_parallel_size must be one of {TP_SIZES}, got {size!r}")
    if expert_parallel and not cfg.is_moe:
        raise ConfigError("enable_expert_parallel needs a mixture-of-experts model; this one has no routed experts, "
                          "drop the option")
    if expert_parallel and cfg.num_experts % size:
        ok = [n for n in TP_SIZES if n < size and cfg.num_experts % n == 0 and _splits(cfg, n, True)]
        raise ConfigError(f"enable_expert_parallel gives each of the {size} ranks whole experts, but "
                          f"num_experts={cfg.num_experts} is not divisible by {size}; use tensor_parallel_size "
                          f"{ok[-1] if ok else 1} or drop enable_expert_parallel")
    if size == 1:
        return
    bad = []
    for what, n in (("num_attention_heads", cfg.num_attention_heads),
                    ("linear_num_key_heads", cfg.linear_num_key_heads),
                    ("linear_num_value_heads", cfg.linear_num_value_heads),
                    ("intermediate_size", cfg.intermediate_size),
                    ("moe_intermediate_size", 0 if expert_parallel else cfg.moe_intermediate_size),
                    ("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size)):
        if n % size:
            bad.append(f"{what}={n}")
    nkv = cfg.num_key_value_heads
    if (nkv >= size and nkv % size) or (nkv < size and size % nkv):
        bad.append(f"num_key_value_heads={nkv} (must divide by, or divide, the rank count)")
    if bad:
        ok = [n for n in TP_SIZES if n < size and _splits(cfg, n, expert_parallel)]
        raise ConfigError(f"tensor_parallel_size {size} does not split this model: {', '.join(bad)} "
                          f"not divisible by {size}; use tensor_parallel_size {ok[-1] if ok else 1}")


def _splits(cfg: ModelConfig, size: int, expert_parallel: bool = False) -> bool:
    try:
        check_tp_size(cfg, size, expert_parallel)
    except ConfigError:
        return False
    return True
