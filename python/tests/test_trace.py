"""The Mooncake replay driven from Python reproduces the reference figures of
data/traces/README.md (first 1,000 requests), and the pure-Python vLLM-style pool of the
benchmark agrees with it. Skipped when the trace is not present."""

import os

import pytest

import mooncake
import replay
import vllm_style  # noqa: F401  (imported by replay; a broken module must fail here)

TRACES = os.environ.get("PAGEDKV_TRACES_DIR",
                        os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces"))
TRACE = os.path.join(TRACES, "mooncake", "conversation_trace.jsonl")
if os.path.exists(TRACE + ".gz") or not os.path.exists(TRACE):
    TRACE += ".gz"


@pytest.fixture(scope="module")
def trace():
    if not os.path.exists(TRACE):
        pytest.skip(f"trace not found: {TRACE}")
    return mooncake.load(TRACE, 1000)


@pytest.mark.parametrize("num_blocks,hit_tokens,evicted", [(1_000_001, 2_962_688, 0),
                                                           (8_193, 511_488, 817_691)])
def test_reference_figures(trace, num_blocks, hit_tokens, evicted):
    r = replay.replay_bindings(trace, num_blocks, hash_scheme="xxh3_128")
    assert r["prompt_tokens"] == 13_732_944
    assert (r["hit_tokens"], r["evicted_blocks"]) == (hit_tokens, evicted)


def test_vllm_style_pool_does_the_same_work(trace):
    sub = trace[:150]
    v = replay.replay_vllm_style(sub, 8_193)
    b = replay.replay_bindings(sub, 8_193, hash_scheme="xxh3_128")
    assert v["hit_tokens"] > 0 and v["evicted_blocks"] > 0
    assert (v["hit_tokens"], v["evicted_blocks"]) == (b["hit_tokens"], b["evicted_blocks"])
