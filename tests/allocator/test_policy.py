"""The margin policy's two paths: the agent's per-tick path and the replay's block path agree.

The per-tick path keeps each workload's state in plain Python with a running peak; the block
path evaluates whole blocks of seconds in arrays. Fed the same seconds, they must reserve
exactly the same (floats compared with ==), second by second, calibration included.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.policy import MarginConfig, MarginPolicy

# Short blocks and a big step: a few blocks move the margin both ways.
CONFIG = MarginConfig(block_s=4, prior_margin=0.5, min_margin=0.0, max_margin=3.0, step=0.4, max_misses_per_block=3)
DECAYS = (400_000, 700_000)  # levels per block without a miss (memory, SMs)
CAP = (90.0, 70.0)

use_value = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
seconds = st.lists(st.tuples(use_value, use_value, use_value, use_value), min_size=CONFIG.block_s, max_size=7 * 4)


def _tick_path(readings: list[tuple[float, float, float, float]], start: int) -> list[tuple[float, float]]:
    """Two readings a second, as the agent's 500 ms ticks; the reservation after each second's last one."""
    policy = MarginPolicy(CONFIG)
    slot = policy.admit(second=start, decays=DECAYS)
    after = []
    for i, (mem_a, sm_a, mem_b, sm_b) in enumerate(readings):
        policy.observe([slot], start + i, [(mem_a, sm_a)], [CAP], [DECAYS])
        after.append(policy.observe([slot], start + i, [(mem_b, sm_b)], [CAP], [DECAYS])[0])
    return after


def _block_path(readings: list[tuple[float, float, float, float]], start: int) -> np.ndarray:
    """Each second's larger reading, fed a block at a time as the replay does; the reservation in force each second."""
    b = CONFIG.block_s
    blocks = len(readings) // b
    use = np.array([(max(ma, mb), max(sa, sb)) for ma, sa, mb, sb in readings[: blocks * b]]).reshape(1, blocks, b, 2)
    policy = MarginPolicy(CONFIG)
    slot = np.array([policy.admit(second=start, decays=DECAYS)], dtype=np.int64)
    in_force = []
    done = 0
    while done < blocks:
        outcome = policy.observe_blocks(slot, use[:, done:], np.array([CAP]))
        taken = int(outcome.consumed[0])
        in_force.append(outcome.reservations[0, :taken].reshape(-1, 2))
        done += taken
    return np.concatenate(in_force)


@settings(max_examples=150, deadline=None)
@given(readings=seconds, start=st.integers(min_value=0, max_value=10**9))
def test_per_tick_path_reserves_what_the_block_path_does(
    readings: list[tuple[float, float, float, float]], start: int
) -> None:
    after = _tick_path(readings, start)
    in_force = _block_path(readings, start)
    assert np.isnan(in_force[0]).all()  # nothing decided before the first second
    # The reservation decided after reading second s is the one in force for second s + 1.
    for s in range(1, in_force.shape[0]):
        assert after[s - 1] == (in_force[s, 0], in_force[s, 1]), s


def test_a_bad_reading_changes_nothing() -> None:
    policy = MarginPolicy(CONFIG)
    a, b = policy.admit(second=10, decays=DECAYS), policy.admit(second=10, decays=DECAYS)
    first = policy.observe([a, b], 10, [(5.0, 5.0), (6.0, 6.0)], [CAP, CAP], [DECAYS, DECAYS])
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            policy.observe([a, b], 11, [(50.0, 50.0), (bad, 1.0)], [CAP, CAP], [DECAYS, DECAYS])
    with pytest.raises(ValueError, match="back in time"):
        policy.observe([a, b], 9, [(5.0, 5.0), (6.0, 6.0)], [CAP, CAP], [DECAYS, DECAYS])
    # Neither workload took in anything: the same readings again give the same reservations.
    assert policy.observe([a, b], 10, [(5.0, 5.0), (6.0, 6.0)], [CAP, CAP], [DECAYS, DECAYS]) == first
