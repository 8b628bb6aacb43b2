import os
import sys

import numpy as np
import pytest

import pagedkv

# python/bench holds the trace loader the trace test shares with the benchmark.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))


def tokens(*values):
    return np.asarray(values, dtype=np.int32)


@pytest.fixture
def kv():
    """A small full-attention manager: 9 usable blocks of 4 tokens, events on."""
    return pagedkv.KVCacheManager(10, block_size=4, hash_seed="test", enable_kv_events=True)
