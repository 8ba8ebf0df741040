"""Engine-side glue of speculative decoding: the MTP checks at start-up and the acceptance counters
(vLLM's spec_decode metrics)."""
from __future__ import annotations

import logging
from collections import Counter

from ..errors import ConfigError
from ..scheduler import SchedulerOutput

log = logging.getLogger("catengine")


def check_mtp(model, num_speculative_tokens: int, path) -> None:
    """ConfigError when MTP is asked for on a checkpoint without an MTP head; the hint to turn it on when
    the checkpoint has one and speculation is off."""
    if num_speculative_tokens and model.mtp is None:
        raise ConfigError(f"speculative_config asks for MTP drafting but {path} has no mtp.* weights (its MTP head "
                          f"was stripped or never trained); drop speculative_config / --speculative-config, or use "
                          f"a checkpoint that ships the MTP layer")
    if not num_speculative_tokens and model.config.mtp_num_hidden_layers:
        log.info("this checkpoint has an MTP head: speculative decoding can speed up decoding, e.g. "
                 "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' "
                 "(Engine(speculative_config={\"method\": \"mtp\", \"num_speculative_tokens\": 3}))")


def count_spec(counters: Counter, out: SchedulerOutput, accepted: dict[int, list[int]]) -> None:
    """Add a step's verify results to the engine's counters."""
    if not accepted:
        return
    row = 0
    for it in out.scheduled:
        if it.num_drafts:
            n = len(accepted[row]) - 1
            counters["spec_decode_num_drafts"] += 1
            counters["spec_decode_num_draft_tokens"] += it.num_drafts
            counters["spec_decode_num_accepted_tokens"] += n
            for pos in range(n):
                counters[f"spec_decode_accepted_pos_{pos}"] += 1
        row += it.num_samples


def spec_stats(counters: Counter, k: int) -> dict:
    """engine.stats() fields: the counters, the per-position acceptances and the mean acceptance length
    (tokens a verify step adds: 1 + accepted drafts per draft round, vLLM's definition)."""
    if not k:
        return {}
    drafts = counters["spec_decode_num_drafts"]
    accepted = counters["spec_decode_num_accepted_tokens"]
    return {"spec_decode_num_drafts": drafts, "spec_decode_num_draft_tokens": counters["spec_decode_num_draft_tokens"],
            "spec_decode_num_accepted_tokens": accepted,
            "spec_decode_num_accepted_tokens_per_pos": [counters[f"spec_decode_accepted_pos_{i}"] for i in range(k)],
            "spec_decode_mean_acceptance_length": 1.0 + accepted / drafts if drafts else 0.0}
