"""Shrinking a failing case with Hypothesis, keeping its failure signature.

`minimise` takes an injected predicate ``still_fails(case) -> bool`` (True when the case still
fails *with the same signature*) and asks Hypothesis's shrinker for the smallest case of the
*neighbourhood* of the failing one that still fails:

* categorical fields stay fixed (dtype, qkv_format, causal, causal_alignment, whether a window
  exists, ``cp_size`` and ``cp_comm_type``): they define the bug class;
* each mask kind (`oracle.mask_kinds.MASK_KINDS`) as it declares (``shrink``): causal kept,
  window bounds toward 0, softcap dropped, at the kind's stage among the choices;
* a CP case stays one that can be laid out (`fuzzer.backends.cp_layout.cp_unsupported_reasons`): bshd/sbhd
  ``seqlen_q``/``seqlen_k`` step in multiples of ``2 * cp_size``, and under ``a2a`` (``a2a+p2p``)
  ``num_heads_kv`` in multiples of ``cp_size`` (2), so ``num_heads`` stays one too; thd lengths
  shrink freely (the CP layout pads them);
* sizes shrink toward 1 (batch_size, num_heads_kv, GQA group, seqlen_q, seqlen_k, per-sequence
  lengths) and head dims toward small common sizes; windows toward 0;
* optional features shrink toward "off" (backward -> forward only, softcap, softmax_scale ->
  default, input distribution -> normal, each input family field of `oracle.inputs` -> its
  default, seed -> 0).

The shrink starts *from the failing case itself*: its choice sequence is known by construction
(one primitive Hypothesis choice per field, in a fixed order) and is stored under the secondary
key of the run's example database, which Hypothesis replays before shrinking (examples under the
primary key are taken as already minimal). The database may be the SQL one shared by all
workers, so a bucket shrunk once is recognised at once by the next worker.

Outcomes are named (``MinimiseOutcome.status``): ``minimised`` (smaller case confirmed k times),
``not_reproduced`` (the original did not fail again: flaky), ``slipped`` (the shrunk case failed
during shrinking but not on re-check; the original is kept), ``unchanged`` (nothing smaller fails).
On the deadline the best case so far is returned.

Source: Hypothesis ``find()`` and ``database.choices_to_bytes`` (hypothesis 6.170), engine
``reuse_existing_test_cases`` (secondary corpus is not assumed shrunk).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, Verbosity, find, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase, choices_to_bytes
from hypothesis.errors import Flaky, NoSuchExample, Unsatisfiable

from oracle import mask_kinds
from oracle.config import INPUT_DISTRIBUTIONS, INPUT_FAMILY_DEFAULTS, AttentionCase, cp_heads_unit

_SMALL_HEAD_DIMS = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class MinimiseOutcome:
    """Result of `minimise`.

    Attributes:
        status: ``minimised``, ``unchanged``, ``slipped``, ``not_reproduced`` or ``interrupted``
            (Ctrl-C during the shrink: `MinimiseInterrupted` carries it).
        case: the case to keep as the bucket's minimised case (the original unless minimised).
        original: the case shrinking started from.
        attempts: calls of ``still_fails`` made.
        elapsed_s: wall time, seconds.
        note: one line for humans (stored with the bucket).
    """

    status: str
    case: AttentionCase
    original: AttentionCase
    attempts: int
    elapsed_s: float
    note: str


def neighbourhood(
    case: AttentionCase, keep_head_dims: bool = False
) -> tuple[st.SearchStrategy[AttentionCase], tuple]:
    """The strategy of cases around ``case``, and the Hypothesis choices that draw ``case`` itself.

    Every field is one primitive choice (``integers``, ``booleans`` or ``sampled_from`` of at
    least two values; a field with a single possible value is ``just`` it and records no
    choice) so the choice sequence of the original is known exactly. With
    ``keep_head_dims`` the head dims stay as they are (for JIT backends, where each head dim tried
    costs a kernel compilation).
    """
    original: list = []

    def ints(lo: int, value: int):
        original.append(value)
        return st.integers(lo, value)

    def steps(unit: int, value: int):
        """Multiples of ``unit`` up to ``value`` (one integer choice: the multiplier); any value
        from 1 when ``value`` is not a multiple (the original case is kept as it is)."""
        if unit <= 1 or value % unit:
            return ints(1, value)
        original.append(value // unit)
        return st.integers(1, value // unit).map(lambda n: n * unit)

    def pick(options: list, value):
        """One choice among ``options``; a single option records no choice (Hypothesis turns
        ``sampled_from([x])`` into ``just(x)``), so nothing is appended for it either: one
        extra index would put every later replayed choice out of step."""
        if len(options) == 1:
            return st.just(value)
        original.append(options.index(value))
        return st.sampled_from(options)

    # Build the per-field strategies in draw order; `original` collects the choices of `case`.
    plan = []
    # context parallelism: the units that keep the case laid out (see the module docstring)
    seqlen_unit = 2 * case.cp_size if case.cp_size > 1 and not case.is_varlen else 1
    heads_unit = cp_heads_unit(case.cp_size, case.cp_comm_type)
    plan.append(("batch_size", ints(1, case.batch_size)))
    plan.append(("num_heads_kv", steps(heads_unit, case.num_heads_kv)))
    plan.append(("group", ints(1, case.group_size)))
    same_v = case.head_dim_v == case.head_dim
    if not keep_head_dims:
        dims = sorted({d for d in _SMALL_HEAD_DIMS if d < case.head_dim} | {case.head_dim})
        plan.append(("head_dim", pick(dims, case.head_dim)))
    if not same_v and not keep_head_dims:
        dims_v = sorted({d for d in _SMALL_HEAD_DIMS if d < case.head_dim_v} | {case.head_dim_v})
        plan.append(("head_dim_v", pick(dims_v, case.head_dim_v)))
    if case.is_varlen:
        for i, n in enumerate(case.seqlens_q_list):
            plan.append((f"seqlens_q[{i}]", ints(1, n)))
        for i, n in enumerate(case.seqlens_k_list):
            plan.append((f"seqlens_k[{i}]", ints(1, n)))
    else:
        plan.append(("seqlen_q", steps(seqlen_unit, case.seqlen_q)))
        plan.append(("seqlen_k", steps(seqlen_unit, case.seqlen_k)))

    def mask_stage(stage: str) -> None:
        """Each mask kind of ``stage`` (`oracle.mask_kinds`): a ``toward_zero`` field that is set
        shrinks toward 0, a ``drop`` field that is set may become None, a ``keep`` one stays."""
        for kind in mask_kinds.kinds(stage):
            for name, on in zip(kind.fields, kind.switches(case)):
                if on and kind.shrink == "toward_zero":
                    plan.append((name, ints(0, getattr(case, name))))
                elif on and kind.shrink == "drop":
                    plan.append((name, pick([None, getattr(case, name)], getattr(case, name))))

    mask_stage("mask")
    default_scale = float(case.head_dim) ** -0.5
    if case.softmax_scale != default_scale:
        plan.append(("softmax_scale", pick([None, case.softmax_scale], case.softmax_scale)))
    mask_stage("scores")
    if case.backward:
        original.append(True)
        plan.append(("backward", st.booleans()))
    if case.input_distribution != INPUT_DISTRIBUTIONS[0]:
        plan.append(
            ("input_distribution", pick([INPUT_DISTRIBUTIONS[0], case.input_distribution], case.input_distribution))
        )
    for name, default in INPUT_FAMILY_DEFAULTS.items():  # only fields that are on add choices
        if getattr(case, name) != default:
            plan.append((name, pick([default, getattr(case, name)], getattr(case, name))))
    if case.seed != 0:
        plan.append(("seed", pick([0, case.seed], case.seed)))

    @st.composite
    def cases(draw) -> AttentionCase:
        values = {name: draw(strategy) for name, strategy in plan}
        batch_size = values["batch_size"]
        head_dim = values.get("head_dim", case.head_dim)
        changes: dict = {
            "batch_size": batch_size,
            "num_heads_kv": values["num_heads_kv"],
            "num_heads": values["num_heads_kv"] * values["group"],
            "head_dim": head_dim,
            "head_dim_v": values.get("head_dim_v", case.head_dim_v) if not same_v else head_dim,
            "backward": values.get("backward", case.backward),
            "input_distribution": values.get("input_distribution", case.input_distribution),
            "seed": values.get("seed", case.seed),
            **{name: values.get(name, getattr(case, name)) for name in INPUT_FAMILY_DEFAULTS},
        }
        scale = values.get("softmax_scale", case.softmax_scale)
        changes["softmax_scale"] = None if scale == default_scale else scale
        for kind in mask_kinds.MASK_KINDS:
            for name in kind.fields:
                changes[name] = values.get(name, getattr(case, name))
        if case.is_varlen:
            sq = tuple(values[f"seqlens_q[{i}]"] for i in range(batch_size))
            sk = tuple(values[f"seqlens_k[{i}]"] for i in range(batch_size))
            changes.update(seqlens_q=sq, seqlens_k=sk, seqlen_q=max(sq), seqlen_k=max(sk))
        else:
            changes.update(seqlen_q=values["seqlen_q"], seqlen_k=values["seqlen_k"])
        return case.replace(**changes)

    return cases(), tuple(original)


def minimise(
    case: AttentionCase,
    still_fails: Callable[[AttentionCase], bool],
    *,
    deadline_s: float = 120.0,
    confirmations: int = 2,
    database: ExampleDatabase | None = None,
    database_key: bytes | None = None,
    keep_head_dims: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> MinimiseOutcome:
    """Shrink ``case`` while ``still_fails`` holds.

    Args:
        case: a case that failed.
        still_fails: True when the given case fails with the same signature as ``case``.
        deadline_s: wall-clock budget in seconds; the best case so far is kept when it passes.
        confirmations: re-runs of the original (before) and of the shrunk case (after) that must
            all fail.
        database: Hypothesis example database (defaults to an in-memory one).
        database_key: key of this bucket in ``database`` (defaults to a hash of the case).
        keep_head_dims: do not shrink head_dim / head_dim_v (see `neighbourhood`).
        clock: seconds, monotonic (the deadline's clock; tests pass a fake one).

    Returns:
        A `MinimiseOutcome` naming what happened.
    """
    start = clock()
    deadline = start + deadline_s
    attempts = 0

    def elapsed() -> float:
        return clock() - start

    def check(candidate: AttentionCase) -> bool:
        nonlocal attempts
        attempts += 1
        return still_fails(candidate)

    if not all(check(case) for _ in range(max(confirmations, 1))):
        return MinimiseOutcome("not_reproduced", case, case, attempts, elapsed(), "original did not fail again")

    strategy, choices = neighbourhood(case, keep_head_dims=keep_head_dims)
    database = database if database is not None else InMemoryExampleDatabase()
    key = database_key or hashlib.sha256(b"attnfuzz-minimise:" + case.case_id.encode()).digest()[:16]
    database.save(key + b".secondary", choices_to_bytes(choices))
    best = [case]
    interrupted = [False]  # Ctrl-C in a check: Hypothesis ends a shrink early on it, without re-raising

    def condition(candidate: AttentionCase) -> bool:
        if clock() > deadline or interrupted[0]:
            return False
        try:
            failed = check(candidate)
        except KeyboardInterrupt:
            interrupted[0] = True
            raise
        if failed:
            if _size(candidate) <= _size(best[0]):
                best[0] = candidate
            return True
        return False

    try:
        found = find(
            strategy,
            condition,
            settings=settings(
                database=database,
                derandomize=False,  # as a fuzz chunk: the same on a machine with $CI set (Hypothesis's "ci" profile)
                phases=[Phase.reuse, Phase.shrink],
                max_examples=1000,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],  # the others flag problems of the strategy
                verbosity=Verbosity.quiet,
                report_multiple_bugs=False,
            ),
            database_key=key,
        )
    except (NoSuchExample, Unsatisfiable, Flaky):
        # Flaky: a candidate failed once and not on Hypothesis's replay; the re-check below decides
        found = best[0]
    except KeyboardInterrupt:
        interrupted[0] = True
    if interrupted[0]:  # stop now, keeping the best case so far (it failed once; not re-confirmed)
        if best[0] == case:
            raise KeyboardInterrupt
        raise MinimiseInterrupted(
            MinimiseOutcome(
                "interrupted",
                best[0],
                case,
                attempts,
                elapsed(),
                f"interrupted (Ctrl-C) after {attempts} runs: best so far, from {case.case_id}, failed once, not re-confirmed",
            )
        )
    candidate = found if _size(found) <= _size(best[0]) else best[0]
    if candidate == case:
        return MinimiseOutcome("unchanged", case, case, attempts, elapsed(), "no smaller case fails the same way")
    if not all(check(candidate) for _ in range(max(confirmations, 1))):
        return MinimiseOutcome(
            "slipped",
            case,
            case,
            attempts,
            elapsed(),
            f"shrunk case {candidate.case_id} did not fail on re-check; original kept",
        )
    timed_out = " (deadline reached: best so far)" if clock() > deadline else ""
    return MinimiseOutcome(
        "minimised",
        candidate,
        case,
        attempts,
        elapsed(),
        f"minimised from {case.case_id} in {attempts} runs, confirmed {confirmations}x{timed_out}",
    )


class MinimiseInterrupted(KeyboardInterrupt):
    """Ctrl-C (KeyboardInterrupt) during `minimise` once a smaller failing case was found:
    ``outcome`` (status ``interrupted``) holds that best case so far, so the caller can store it
    before stopping. Being a KeyboardInterrupt, it stops whoever does not look for it."""

    def __init__(self, outcome: MinimiseOutcome):
        super().__init__(outcome.note)
        self.outcome = outcome


def _size(case: AttentionCase) -> tuple:
    """Order used to keep the smallest failing case seen (work first, then flags)."""
    work = case.batch_size * case.num_heads * case.total_q * max(case.seqlens_k_list) * case.head_dim
    dropped = tuple(kind.is_on(case) for kind in mask_kinds.MASK_KINDS if kind.shrink == "drop")  # softcap, ...
    return (work, case.backward, *dropped, case.seed)
