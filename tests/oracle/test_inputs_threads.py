"""`oracle.inputs.hash_normal` on the CPU splits long ranges over threads without changing a bit.

`_hash_normal_threaded` cuts a range of at least `_HASH_SPLIT_MIN` elements into pieces, one per
thread (``$ATTNFUZZ_INPUT_THREADS``, default ``min(2, usable cores)``), computed by
`_hash_normal_numpy` in the calling thread and the module's pool. These tests check that the
bits do not depend on the thread count, the cut or the cache (a tail computed past a cached
prefix), that a bad thread count is refused, and (planted) that the split really happens: they
fail if splitting is silently disabled.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pytest
import torch

import oracle.inputs as inputs
from oracle.inputs import hash_normal
from tests.oracle.test_inputs_hash import assert_bit_identical, reference_hash_normal

BLOCK = inputs._HASH_BLOCK


@pytest.fixture
def fresh_cache(monkeypatch):
    """An empty `hash_normal` cache for the test (the module's own is left as it was)."""
    monkeypatch.setattr(inputs, "_hash_cache", OrderedDict())
    monkeypatch.setattr(inputs, "_hash_cache_bytes", 0)


def _computed(monkeypatch, seed, stream, numel, threads, prefix=0):
    """``hash_normal(seed, stream, numel)`` with ``threads`` threads from an empty cache, after
    ``hash_normal(seed, stream, prefix)`` (cached, so only the tail past it is computed)."""
    monkeypatch.setattr(inputs, "_hash_cache", OrderedDict())
    monkeypatch.setattr(inputs, "_hash_cache_bytes", 0)
    monkeypatch.setenv(inputs.INPUT_THREADS_ENV, str(threads))
    if prefix:
        hash_normal(seed, stream, prefix)
    return hash_normal(seed, stream, numel)


def _record_pieces(monkeypatch):
    """Wrap `_hash_normal_numpy` so that every call records ``(thread id, start, stop, block)``."""
    calls = []
    real = inputs._hash_normal_numpy

    def recording(key1, key2, start0, stop, result, block=0):
        calls.append((threading.get_ident(), start0, stop, block))
        real(key1, key2, start0, stop, result, block)

    monkeypatch.setattr(inputs, "_hash_normal_numpy", recording)
    return calls


# sizes around the real threshold (one of them a multiple of neither block) and far above it
REAL_SIZES = (inputs._HASH_SPLIT_MIN - 1, inputs._HASH_SPLIT_MIN, inputs._HASH_SPLIT_MIN + 12_345, 700_001)


@pytest.mark.parametrize("numel", REAL_SIZES)
def test_threaded_bits_equal_one_thread_and_the_original(monkeypatch, numel):
    expected = reference_hash_normal(3, 2, numel)
    one = _computed(monkeypatch, 3, 2, numel, threads=1)
    assert_bit_identical(one, expected, ("1 thread", numel))
    for threads in (2, 3):
        assert_bit_identical(_computed(monkeypatch, 3, 2, numel, threads), expected, (threads, numel))


@pytest.mark.parametrize("split_min", [2, 1000, 2 * BLOCK, 3 * BLOCK + 7])
def test_bits_do_not_depend_on_the_cut_the_thread_count_or_a_cached_prefix(monkeypatch, split_min):
    """With a small threshold (pieces shorter than a block, cuts anywhere), every size, thread
    count and cached prefix gives the bits of one thread."""
    monkeypatch.setattr(inputs, "_HASH_SPLIT_MIN", split_min)
    for numel in (1, 7, 1001, BLOCK, BLOCK + 5, 2 * BLOCK, 3 * BLOCK + 1, 5 * BLOCK - 3):
        for prefix in (0, 1, 999, BLOCK + 1):
            if prefix >= numel:
                continue
            expected = _computed(monkeypatch, 11, 4, numel, threads=1, prefix=prefix)
            for threads in (2, 3, 5):
                got = _computed(monkeypatch, 11, 4, numel, threads, prefix=prefix)
                assert_bit_identical(got, expected, (split_min, numel, prefix, threads))


def test_a_tail_past_a_cached_prefix_is_split_and_matches_the_original(monkeypatch):
    prefix, numel = 10_000, 10_000 + inputs._HASH_SPLIT_MIN + 3
    calls = _record_pieces(monkeypatch)
    got = _computed(monkeypatch, 2024, 1, numel, threads=2, prefix=prefix)
    assert_bit_identical(got, reference_hash_normal(2024, 1, numel), "tail past a cached prefix")
    tail = [(start, stop) for _, start, stop, _ in calls if stop > prefix]
    assert tail == [(prefix, prefix + (numel - prefix) // 2), (prefix + (numel - prefix) // 2, numel)]


def test_the_split_happens_by_default_on_two_cores(monkeypatch, fresh_cache):
    """Planted: with the variable unset and two usable cores, a long range is cut in two pieces,
    one computed in another thread, together covering the range once; a shorter range, or one
    thread, is computed in one call in the calling thread. Fails if splitting is disabled."""
    monkeypatch.delenv(inputs.INPUT_THREADS_ENV, raising=False)
    monkeypatch.setattr(inputs, "_usable_cores", 2)
    submitted = []
    real_pool = inputs._hash_thread_pool

    def recording_pool(workers):
        pool = real_pool(workers)

        class Recording:
            def submit(self, fn, *args):
                submitted.append(args[2:4])
                return pool.submit(fn, *args)

        return Recording()

    monkeypatch.setattr(inputs, "_hash_thread_pool", recording_pool)
    calls = _record_pieces(monkeypatch)
    numel = inputs._HASH_SPLIT_MIN + 1001
    got = hash_normal(5, 3, numel)
    assert_bit_identical(got, reference_hash_normal(5, 3, numel), "split")
    half = numel // 2
    assert submitted == [(half, numel)]
    assert sorted((start, stop, block) for _, start, stop, block in calls) == [
        (0, half, inputs._HASH_SPLIT_BLOCK), (half, numel, inputs._HASH_SPLIT_BLOCK)]
    me = threading.get_ident()
    assert {ident == me for ident, *_ in calls} == {True, False}, "one piece here, one in the pool"

    calls.clear()
    hash_normal(6, 3, inputs._HASH_SPLIT_MIN - 1)  # too short to split
    assert calls == [(me, 0, inputs._HASH_SPLIT_MIN - 1, 0)]
    calls.clear()
    monkeypatch.setenv(inputs.INPUT_THREADS_ENV, "1")
    hash_normal(7, 3, numel)
    assert calls == [(me, 0, numel, 0)]
    assert submitted == [(half, numel)]  # nothing more went to the pool


def test_the_default_is_two_threads_at_most_and_one_on_one_core(monkeypatch):
    monkeypatch.delenv(inputs.INPUT_THREADS_ENV, raising=False)
    for cores, threads in ((1, 1), (2, 2), (16, 2)):
        monkeypatch.setattr(inputs, "_usable_cores", cores)
        assert inputs.input_threads() == threads
    monkeypatch.setattr(inputs, "_usable_cores", None)  # measured again, from the affinity mask
    assert 1 <= inputs.input_threads() <= 2
    monkeypatch.setenv(inputs.INPUT_THREADS_ENV, " 4 ")
    assert inputs.input_threads() == 4
    monkeypatch.setenv(inputs.INPUT_THREADS_ENV, "")
    assert inputs.input_threads() in (1, 2)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "2x"])
def test_a_bad_thread_count_is_refused_naming_the_variable_and_the_allowed_values(monkeypatch, fresh_cache, value):
    monkeypatch.setenv(inputs.INPUT_THREADS_ENV, value)
    with pytest.raises(ValueError, match=r"ATTNFUZZ_INPUT_THREADS: must be an integer >= 1"):
        inputs.input_threads()
    with pytest.raises(ValueError, match=r"ATTNFUZZ_INPUT_THREADS.*" + repr(value).replace(".", r"\.")):
        hash_normal(1, 1, 10)  # even a short range: the value is checked whenever samples are computed


def test_an_error_in_a_pooled_piece_reaches_the_caller(monkeypatch, fresh_cache):
    monkeypatch.setenv(inputs.INPUT_THREADS_ENV, "2")
    monkeypatch.setattr(inputs, "_HASH_SPLIT_MIN", 2)
    real = inputs._hash_normal_numpy
    main = threading.get_ident()

    def failing_elsewhere(key1, key2, start0, stop, result, block=0):
        if threading.get_ident() != main:
            raise RuntimeError("piece failed")
        real(key1, key2, start0, stop, result, block)

    monkeypatch.setattr(inputs, "_hash_normal_numpy", failing_elsewhere)
    with pytest.raises(RuntimeError, match="piece failed"):
        hash_normal(1, 2, 100)
    assert inputs._hash_keys(1, 2) not in inputs._hash_cache  # nothing half-computed is cached


def test_the_pool_grows_when_more_threads_are_asked_for(monkeypatch, fresh_cache):
    monkeypatch.setattr(inputs, "_HASH_SPLIT_MIN", 2)
    monkeypatch.setattr(inputs, "_hash_pool", None)
    monkeypatch.setattr(inputs, "_hash_pool_workers", 0)
    calls = _record_pieces(monkeypatch)
    for threads, numel in ((2, 50), (4, 4000)):
        monkeypatch.setenv(inputs.INPUT_THREADS_ENV, str(threads))
        calls.clear()
        got = hash_normal(threads, 9, numel)
        assert torch.equal(got.view(torch.int64), reference_hash_normal(threads, 9, numel).view(torch.int64))
        assert len(calls) == threads and inputs._hash_pool_workers >= threads - 1
