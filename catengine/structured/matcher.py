"""One sequence's grammar state: which tokens may come next, advanced by each accepted token.

The engine makes one per completion (:meth:`GrammarBackend.matcher`) and hangs it on the scheduler's
``Sequence.grammar``; the runner fills the sequence's bitmask row from it before sampling, the
completion advances it with every sampled token and releases it when the completion finishes (stop,
length, abort). A preempted sequence keeps its matcher: preemption recomputes the KV of tokens that
stay, so the grammar state stays valid.

Speculative decoding (not built yet) would check drafts here: accept the drafted tokens one by one
(``accept`` is False at the first token the grammar refuses: the draft is cut there), fill one mask
row per draft position from the advanced state, and ``rollback`` the tokens the target model rejects
(xgrammar's ``max_rollback_tokens`` must then be set when the matcher is built).
"""
from __future__ import annotations

from typing import Callable


class GrammarState:
    __slots__ = ("_matcher", "_on_release", "rejected")

    def __init__(self, matcher, on_release: Callable[[], None]):
        self._matcher = matcher
        self._on_release = on_release
        self.rejected = False        # a token the grammar refused was sampled (only when every token was masked)

    @property
    def released(self) -> bool:
        return self._matcher is None

    def fill(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32 words, bit t % 32 of word t // 32)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False (and the state unchanged) if the grammar does not allow it."""
        ok = self._matcher.accept_token(int(token))
        self.rejected |= not ok
        return ok

    @property
    def terminated(self) -> bool:
        """The grammar ended: it accepted one of the request's stop tokens."""
        return self._matcher.is_terminated()

    def release(self) -> None:
        if self._matcher is not None:
            self._matcher = None
            self._on_release()
