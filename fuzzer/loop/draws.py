"""What a worker's fuzz chunks draw (`Draws`): the Hypothesis strategy of a chunk, its target plan
over the usable backends, and the filter that keeps a draw for a backend to cases it runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from fuzzer.backends.base import Backend
from fuzzer.coverage import target_plan
from fuzzer.evaluate import declared_reasons
from fuzzer.guard import PluginCallError, PluginGuard
from fuzzer.known import FamilyHistory, reduced_weights
from fuzzer.loop.config import WorkerConfig
from fuzzer.loop.stats import WorkerStats
from fuzzer.strategies import attention_cases, merge_capabilities
from oracle.config import AttentionCase

MAX_STRATEGIES_PER_TARGET = 4
"""Cached per-target strategies kept per backend (`Draws.target_strategy`)."""


def target_runs(backend: Backend, case: AttentionCase, guard: PluginGuard | None = None) -> bool:
    """Whether ``backend`` runs ``case`` in at least one variant (no `unsupported_reasons`): the
    filter of a draw for it. `Capabilities` are coarse (a range and a multiple of head_dim, a
    set of alignments); the adapters' own rules are finer (cuDNN SDPA: head_dim >= 16 and
    seqlen_k > 1; TE on FlashAttention: no top-left causal mask with seqlen_q != seqlen_k), and
    a draw for a backend that the backend then refuses was wasted: on the H200 (2026-12-01) 64
    draws for torch-sdpa-cudnn gave it 53 cases in all. Hypothesis draws again (three tries,
    then the example is discarded, not run). A plugin whose check raises or returns garbage counts
    as running it (the evaluation then records its ``error:PluginError``); a quarantined one, or
    one whose check runs past the deadline (`fuzzer.guard`: then quarantined), as not running it."""
    try:
        return any(not reasons for reasons in declared_reasons(backend, case, None, guard).values())
    except PluginCallError as exc:  # a plugin's check must not stop the fuzz loop
        return not exc.timed_out



class Draws:
    """The strategies of one worker's fuzz chunks.

    Args:
        config: the worker's settings (bounds, ``draw``, ``chunk_size``, ``reuse_kernels``,
            ``kernel_pool_size``, ``known_hit_budget``).
        backends: every selected backend by name.
        usable: the backends usable now.
        stats: the worker's figures (``runnable``, ``targeted``, ``known_load`` read;
            ``family_weights``, ``untargeted_busy`` set).
        families: the input families of recent fuzz cases (`fuzzer.known.FamilyHistory`).
        chunk_commons: ``chunk_commons(names, common)``: each target's strategy arguments for
            the chunk, with its kernel templates under a compile budget
            (`fuzzer.loop.compile_budget.CompileBudget.chunk_commons`).
        executor: the evaluator's executor now (None before the worker opened).
        lanes_on: whether fuzz cases run in lanes now.
        guard: what the backends' own methods are called through (None: directly).
    """

    def __init__(
        self,
        *,
        config: WorkerConfig,
        backends: dict[str, Backend],
        usable: Callable[[], list[Backend]],
        stats: WorkerStats,
        families: FamilyHistory,
        chunk_commons: Callable[[list[str], dict[str, Any]], dict[str, dict[str, Any]]],
        executor: Callable[[], Any],
        lanes_on: Callable[[], bool],
        guard: Callable[[], PluginGuard | None] = lambda: None,
    ):
        self.config = config
        self.backends = backends
        self._usable = usable
        self.stats = stats
        self.families = families
        self._chunk_commons = chunk_commons
        self._executor = executor
        self._lanes_on = lanes_on
        self._guard = guard
        self.head_dim_pool: list[int] = []  # the first head dims run (``reuse_kernels``)
        self._target_strategies: dict[tuple, Any] = {}  # (name, common) -> strategy (`target_strategy`)

    def note_ran(self, case: AttentionCase) -> None:
        """A fuzz case ran on some backend: its head dim joins the pool (the first
        ``kernel_pool_size`` seen) that ``reuse_kernels`` draws three times as often."""
        if case.head_dim not in self.head_dim_pool and len(self.head_dim_pool) < self.config.kernel_pool_size:
            self.head_dim_pool.append(case.head_dim)

    def strategy(self, chunk: int = 0):
        """The Hypothesis strategy of one chunk: ``(target, case)`` pairs.

        ``draw="union"``: ``target`` is None and the case is drawn inside the union of the usable
        backends' capabilities. ``draw="targeted"``: ``target`` is a usable backend's name, from
        a plan of ``chunk_size`` targets (`fuzzer.coverage.target_plan` over the counts so far,
        rotated by ``chunk``), and the case is drawn inside that backend's capabilities (so no
        float32 for a backend without it, no softcap for one without softcap, head dims within
        its limit and multiple). A ``sampled_from`` over the plan picks the target: the plan's
        first entry, the most favoured backend, is what it shrinks toward; under ``--seed`` the
        plan and the draws are reproducible. With lanes, a backend busy with an earlier case when
        the chunk starts is left out of the plan while another is free (`busy_backends`).

        Known buckets (`fuzzer.known`, with a ``known_hit_budget``): the plan counts each target's
        cases that hit a spent bucket as extra load (``stats.known_load``), and the input families
        whose recent cases keep hitting spent buckets are drawn less (``family_weights`` of
        `fuzzer.strategies.attention_cases`; ``stats.family_weights``). With no spent bucket the
        strategy is the one without them.
        """
        c = self.config
        common = dict(
            max_batch_size=c.max_batch_size,
            max_heads_kv=c.max_heads_kv,
            max_seqlen=c.max_seqlen,
            max_work=c.max_work,
            max_elements=c.max_elements,
            seed_pool=c.seed_pool,
            allow_backward=c.allow_backward,
            preferred_head_dims=tuple(self.head_dim_pool) if c.reuse_kernels else (),
            max_cp_size=getattr(self._executor(), "max_cp_size", 1),
        )
        weights = reduced_weights(self.families.weights()) if c.known_hit_budget is not None else ()
        self.stats.family_weights = dict(weights)
        if weights:  # only then: without, the strategy objects (and draws) of a run with no spent bucket
            common["family_weights"] = weights
        if c.draw == "union":  # no kernel templates: a union draw has no one backend's kernels to reuse
            caps = merge_capabilities([b.capabilities for b in self._usable()])
            return attention_cases(capabilities=caps, **common).map(lambda case: (None, case))
        names = [b.name for b in self._usable()]
        busy = self.busy_backends()
        free = [n for n in names if n not in busy]
        if busy and free:  # a busy backend sits out the cases drawn meanwhile: draw for the free ones
            self.stats.untargeted_busy.update(n for n in names if n in busy)
            names = free
        slots = max(c.chunk_size, len(names))
        plan = target_plan(names, self.stats.runnable, self.stats.targeted, slots, chunk, self.stats.known_load)
        commons = self._chunk_commons(list(dict.fromkeys(plan)), common)
        per_target = {name: self.target_strategy(name, commons[name]) for name in commons}
        return st.sampled_from(plan).flatmap(per_target.__getitem__)

    def busy_backends(self) -> set[str]:
        """The usable backends whose environment's child is still working on an earlier case now
        (lanes only; the executor's ``busy_environments``): none without lanes.

        Why: a backend busy in its lane sits out every case drawn meanwhile (`fuzzer.executor.BUSY`),
        so a chunk's draws for it ran on the other backends only, all inside its capabilities
        (and over its compile budget its templates). The target plan favours the least covered backend,
        which a backend busy compiling stays: on the H200 (2026-12-02, 4517ce8;
        `benchmarks/gpu/results/2026-12-02-4517ce8-default/manifest.json`) 2,458 of the 3,508 cases were
        drawn for torch-flex (busy on 2,236 of them, one kernel template), and only 8% of the stored
        cases were causal, 10% with a backward pass. So `strategy` leaves the busy backends out of the
        chunk's plan while some backend is free."""
        if not self._lanes_on():
            return set()
        busy_environments = getattr(self._executor(), "busy_environments", None)
        if busy_environments is None:
            return set()
        try:
            environments = set(busy_environments())
        except Exception:  # an executor's report must not stop the fuzz loop
            return set()
        return {b.name for b in self._usable() if b.environment in environments}

    def target_strategy(self, name: str, common: dict[str, Any]):
        """``attention_cases`` inside backend ``name``'s capabilities, mapped to ``(name, case)``;
        kept per ``(name, common)`` so a chunk reuses the strategy objects (and the validation
        Hypothesis caches on them) of an earlier chunk with the same bounds: the same draws.
        ``common`` includes the kernel templates and their share, so a JIT backend's new template
        makes a new strategy; a name's entries are kept for its last `MAX_STRATEGIES_PER_TARGET`
        keys (the templates only grow, so older ones do not come back)."""
        cache = self._target_strategies
        key = (name, tuple(sorted(common.items())))
        if key not in cache:
            mine = [k for k in cache if k[0] == name]
            for old in mine[: max(0, len(mine) - MAX_STRATEGIES_PER_TARGET + 1)]:
                del cache[old]
            backend = self.backends[name]
            cache[key] = (
                attention_cases(capabilities=backend.capabilities, **common)
                .filter(lambda case, backend=backend: target_runs(backend, case, self._guard()))
                .map(lambda case, name=name: (name, case))
            )
        return cache[key]
