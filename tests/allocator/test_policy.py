"""The policy's two paths (allocator.policy): per tick and many blocks at once grant the same.

The per-tick path keeps each workload's state in plain Python with a running peak; the block
path evaluates whole blocks of seconds in arrays. Fed the same seconds they must reserve
exactly the same (floats compared with ==), second by second, calibration included.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.policy import MarginConfig, MarginPolicy


@settings(max_examples=60, deadline=None)
@given(
    block_s=st.integers(2, 6),
    window_blocks=st.integers(1, 4),
    blocks=st.integers(1, 9),
    chunk=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    spiky=st.booleans(),
)
def test_per_tick_and_block_paths_reserve_the_same_every_second(
    block_s: int, window_blocks: int, blocks: int, chunk: int, seed: int, spiky: bool
) -> None:
    config = MarginConfig(block_s=block_s, window_blocks=window_blocks, prior_margin=0.2, min_margin=0.0, step=0.3)
    rng = np.random.default_rng(seed)
    n = 3
    use = rng.uniform(1.0, 2.0, (n, blocks, 2, block_s))
    if spiky:  # rare large bursts: misses, so the margins move
        use *= np.where(rng.random(use.shape) < 0.05, 4.0, 1.0)
    cap = np.full((n, 2), 50.0)
    decays = (200_000, 300_000)  # loose targets: the margins also fall within a few blocks

    ticking = MarginPolicy(config)
    slots = np.array([ticking.admit(second=100, decays=decays) for _ in range(n)])
    per_tick = np.empty((n, blocks * block_s, 2))
    caps, tick_decays = [(50.0, 50.0)] * n, [decays] * n
    for t in range(blocks * block_s):
        second = use[:, t // block_s, :, t % block_s]
        # Two readings a second, as the agent's 500 ms ticks: the second's larger one counts.
        ticking.observe(slots.tolist(), 100 + t, [(m / 2, s / 3) for m, s in second.tolist()], caps, tick_decays)
        per_tick[:, t] = ticking.observe(slots.tolist(), 100 + t, [(m, s) for m, s in second.tolist()], caps, tick_decays)

    batched = MarginPolicy(config)
    slots = np.array([batched.admit(second=100, decays=decays) for _ in range(n)])
    in_force = np.full((n, blocks, 2, block_s), np.nan)
    done = np.zeros(n, dtype=np.int64)
    while (done < blocks).any():  # the slots not done, each from its own block on, up to ``chunk`` blocks a call
        active = np.flatnonzero(done < blocks)
        left = blocks - done[active]
        k = int(min(chunk, left.max()))
        index = np.minimum(done[active, None] + np.arange(k)[None, :], blocks - 1)
        outcome = batched.observe_blocks(slots[active], use[active[:, None], index], cap[active], valid=left)
        for row, i in enumerate(active):
            taken = int(outcome.consumed[row])
            in_force[i, done[i] : done[i] + taken] = outcome.reservations[row, :taken]
        done[active] += outcome.consumed
    # The reservation decided on reading second t is the one in force for second t + 1.
    flat = in_force.transpose(0, 1, 3, 2).reshape(n, blocks * block_s, 2)
    np.testing.assert_array_equal(per_tick[:, :-1], flat[:, 1:])
    np.testing.assert_array_equal(ticking.levels(slots), batched.levels(slots))


def test_a_bad_reading_changes_nothing() -> None:
    policy = MarginPolicy(MarginConfig(block_s=4, window_blocks=2))
    decays, cap = (400_000, 700_000), (90.0, 70.0)
    a, b = policy.admit(second=10, decays=decays), policy.admit(second=10, decays=decays)
    first = policy.observe([a, b], 10, [(5.0, 5.0), (6.0, 6.0)], [cap, cap], [decays, decays])
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            policy.observe([a, b], 11, [(50.0, 50.0), (bad, 1.0)], [cap, cap], [decays, decays])
    with pytest.raises(ValueError, match="back in time"):
        policy.observe([a, b], 9, [(5.0, 5.0), (6.0, 6.0)], [cap, cap], [decays, decays])
    # Neither workload took in anything: the same readings again give the same reservations.
    assert policy.observe([a, b], 10, [(5.0, 5.0), (6.0, 6.0)], [cap, cap], [decays, decays]) == first
