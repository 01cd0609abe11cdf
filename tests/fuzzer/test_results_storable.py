"""`fuzzer.results._storable_json` (one search over the gathered strings) against the per-string
walk it replaced, and `CaseResult`'s normalisation of metrics that need escaping."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzer.results import CaseResult, _storable_json
from fuzzer.text import is_storable


def _walk(value: Any) -> bool:
    """The previous definition: `is_storable` of every string, keys must be strings."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not is_storable(item):
                return False
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str) or not is_storable(key):
                    return False
                stack.append(child)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return True


_TEXT = st.text(alphabet=st.sampled_from(["a", "\x00", "\ud800", "\udcff", "é", "\x01", "z"]), max_size=4)
_KEYS = st.one_of(_TEXT, st.integers(0, 3), st.booleans(), st.none())
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), _TEXT),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.tuples(children, children), st.dictionaries(_KEYS, children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(_JSON)
def test_storable_json_matches_the_per_string_walk(value: Any) -> None:
    assert _storable_json(value) == _walk(value)


def test_storable_json_cases() -> None:
    assert _storable_json({"out": {"a": [1, 2.5, None, True], "b": "ok"}})
    assert not _storable_json({"out": {"a\x00": 1}})
    assert not _storable_json({"out": ["x", "\udcff"]})
    assert not _storable_json({1: "x"})
    # a surrogate pair split over two strings is two lone surrogates, in the join as in the parts
    assert not _storable_json({"a": "\ud83d", "b": "\ude00"})


def test_case_result_escapes_unstorable_metrics() -> None:
    r = CaseResult(case_id="c", backend="b", variant="v", status="pass", metrics={"k\x00": ["\udcff", 1.0]})
    assert r.metrics == {"k\\x00": ["\\udcff", 1.0]}
