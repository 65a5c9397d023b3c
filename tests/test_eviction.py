"""GenAI's KV-cache eviction (simkv/serving/sched/eviction.py): the configuration, its checks and the rule, by hand.

The rule (openvino.genai ``cache_eviction.cpp``, docs/DESIGN.md §4d): with ``T`` tokens held after the forward
of a step, a sequence past its prompt drops ``floor(T / B) - max / B`` blocks once ``T >= max + B``; KVCrush with
budget ``b`` keeps ``b`` of them when at least ``b`` would go.
"""

from __future__ import annotations

import pytest

from simkv.errors import ConfigError
from simkv.serving.sched.eviction import CacheEviction, parse_cache_eviction

B = 32


def test_parse_takes_genai_defaults_and_the_flag_form():
    assert parse_cache_eviction(None) is None and parse_cache_eviction("off") is None
    assert parse_cache_eviction("on") == CacheEviction(32, 128, 672, 0)  # CacheEvictionConfig's defaults
    e = parse_cache_eviction("start=32,recent=64,max=160,kvcrush=2")
    assert e == CacheEviction(32, 64, 160, 2)
    assert e.label() == "start=32,recent=64,max=160,kvcrush=2"
    assert parse_cache_eviction("max=256") == CacheEviction(32, 128, 256, 0)
    assert parse_cache_eviction(CacheEviction(64, 32, 192).label()) == CacheEviction(64, 32, 192)


@pytest.mark.parametrize("text, message", [
    ("start=32,recnt=128", "takes start=N"),
    ("start", "takes start=N"),
    ("max=abc", "whole number"),
    ("max=-32", "must be in 0.."),
    ("max=10**9", "whole number"),
    ("max=1000000000", "must be in 0.."),
    ("max=64,max=96", "twice"),
])
def test_parse_errors_are_one_line(text, message):
    with pytest.raises(ConfigError) as err:
        parse_cache_eviction(text)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("eviction, message", [
    (CacheEviction(0, 32, 96), "start must be > 0"),
    (CacheEviction(32, 32, 64), "max (64) must be larger than start + recent (64)"),
    (CacheEviction(16, 32, 96), "start (16) must be a multiple of the block size 32"),
    (CacheEviction(32, 32, 100), "max (100) must be a multiple of the block size 32"),
])
def test_checks_name_genai_s_own(eviction, message):
    with pytest.raises(ConfigError) as err:
        eviction.check(B)
    assert message in str(err.value) and "GenAI" in str(err.value)


def test_blocks_to_drop_by_hand():
    e = CacheEviction(32, 32, 96)  # max / B = 3
    # below max + B = 128 nothing goes, whatever the start and recent
    assert [e.blocks_to_drop(t, B) for t in (0, 96, 97, 127)] == [0, 0, 0, 0]
    # T = 128: floor(128/32) - 3 = 1 block, leaving 96 tokens (3 blocks); T = 159 still 1 (leaves 127: 4 blocks)
    assert e.blocks_to_drop(128, B) == 1 and e.blocks_to_drop(159, B) == 1
    # a 300-token prompt's first decode step holds 301: floor(301/32) - 3 = 9 - 3 = 6 blocks go, 109 tokens stay
    assert e.blocks_to_drop(301, B) == 6


def test_kvcrush_keeps_its_budget_only_when_at_least_that_many_would_go():
    e1, e2 = CacheEviction(32, 32, 96, 1), CacheEviction(32, 32, 96, 2)
    # n = floor(T/32) - 3 blocks would go; KVCrush keeps b of them when n >= b (kvcrush.cpp: min(n, b) retained)
    assert e1.blocks_to_drop(128, B) == 0  # n = 1 >= b = 1: the one block is kept
    assert e1.blocks_to_drop(160, B) == 1  # n = 2: one goes
    assert e2.blocks_to_drop(128, B) == 1  # n = 1 < b = 2: KVCrush does not apply, the block goes
    assert e2.blocks_to_drop(301, B) == 4  # n = 6 >= 2: 6 - 2
