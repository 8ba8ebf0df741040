"""The scheduler's draft bookkeeping: spare state slots taken and given back, the rollback swap."""
from catengine.scheduler.drafts import commit_verify, take_draft_slots
from catengine.scheduler.request import Sequence
from catengine.scheduler.state_cache import StateCache


def seq(tokens=10, limit=100):
    s = Sequence(seq_id=0, request_id="r", index=0, token_ids=list(range(tokens)), num_prompt_tokens=5,
                 max_total_tokens=limit, arrival=0, can_draft=True)
    return s


def test_draft_slots_respect_limits_and_the_admission_reserve():
    states = StateCache(6)
    s = seq()
    s.state_slot = states.allocate_live()
    assert take_draft_slots(s, states, 3, budget=100, reserve=0) == 3 and len(s.spare_slots) == 3
    assert take_draft_slots(s, states, 3, budget=3, reserve=0) == 2          # budget: 1 + 2 tokens
    assert take_draft_slots(s, states, 0, budget=100, reserve=0) == 0 and s.spare_slots == []   # given back
    assert states.num_free_live == 5
    assert take_draft_slots(s, states, 3, budget=100, reserve=4) == 1        # 5 free, 4 kept for admissions
    near_end = seq(tokens=98)
    near_end.state_slot = states.allocate_live()
    assert take_draft_slots(near_end, states, 3, budget=100, reserve=0) == 1  # room for 2 more tokens
    near_end.can_draft = False
    assert take_draft_slots(near_end, states, 3, budget=100, reserve=0) == 0


def test_commit_verify_swaps_to_the_accepted_slot():
    s = seq()
    s.num_computed, s.state_slot, s.spare_slots = 9, 0, [1, 2, 3]
    assert commit_verify(s, 9, 3, [7, 8]) == [7, 8]        # one draft accepted, then the target's token
    assert s.token_ids[-2:] == [7, 8] and s.num_computed == 11
    assert s.state_slot == 2 and sorted(s.spare_slots) == [0, 1, 3] and s.spare_slots[1] == 0
    commit_verify(s, 11, 3, [1, 2, 3, 4])                    # all accepted: the live slot holds the last state
    assert s.state_slot == 2 and s.num_computed == 15
