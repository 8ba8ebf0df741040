"""Speculative decoding with the checkpoint's MTP head (issue 20).

:mod:`.drafter` proposes the drafts (the MTP head, or the test hooks that always / never match), :mod:`.accept`
checks them against the target's verify forward. The scheduler decides how many drafts a sequence verifies
(``ScheduledSeq.num_drafts``); the runner calls the drafter before the forward and the acceptance after it.
"""
from .accept import accept, can_draft
from .drafter import Drafter, MTPDrafter, ScriptedDrafter

__all__ = ["Drafter", "MTPDrafter", "ScriptedDrafter", "accept", "can_draft"]
