"""The compile budget of JIT backends (``Backend.jit_compiled``; `WorkerConfig.jit_share`): the
gate that keeps a backend over its budget from building new kernels, the kernel templates its
draws reuse, and the quarantine of kernel keys that crashed, timed out or did not build.

One `CompileBudget` per worker owns the state (the templates, the crashed keys, the kernel
classes run); it reads and adds to the worker's `WorkerStats` (``compile_by_backend``,
``kernel_keys``, ``compile_gated``, ...) and is handed what it asks of the worker as callables
(the usable backends, whether lanes are on, the fuzzing seconds so far, the plugin guard).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fuzzer.backends.base import Backend
from fuzzer.evaluate import applicable_tasks, declared_reasons
from fuzzer.executor import COMPILE_ERROR_TYPES  # its kernel did not build (quarantined, not shrunk)
from fuzzer.guard import PluginCallError, PluginGuard
from fuzzer.loop.stats import WorkerStats
from fuzzer.results import CaseResult
from fuzzer.strategies import KernelTemplate
from oracle import mask_kinds
from oracle.config import AttentionCase

MAX_KERNEL_TEMPLATES = 64
"""Kernel templates kept per JIT backend (the first ones seen; `fuzzer.strategies.KERNEL_TEMPLATE_SLOTS`
is as large, so the template index keeps its bounds)."""
TEMPLATE_SHARE_OVER = 1.0
"""Share of a JIT backend's draws that reuse one of its kernel templates while compilation is over
``jit_share`` of the fuzzing wall time: all of them, no new kernel key until compilation is back
within the budget. Measured (`benchmarks/jit_budget.py`: a planted JIT backend on CPU, 0.5 s per
new key against 50 ms per case, 800 cases, ``jit_share=0.2``, seed 1): with 0.9 (one draw in ten
opening a new key) compilation stayed at 35% of wall time (44 keys): a free draw opens a new key
almost every time, so one draw in ten costs ``0.1 * 0.5 s`` per 50 ms case, 50% in the long run;
0.9 holds a 20% budget only when one compile costs less than about 2.5 cases, and a compile of
FA4 or flex costs seconds (assumed many cases; not measured per key here). New keys are still opened whenever compilation is within
the budget (`TEMPLATE_SHARE_UNDER`), so the budget, not the share, sets how many."""
TEMPLATE_SHARE_UNDER = 0.5
"""The same share while compilation is within ``jit_share``: half of the draws still reuse a built
kernel. Same measurement, with `TEMPLATE_SHARE_OVER` 1.0: free draws below the budget (0.0) gave
25 keys and 24% compilation (a chunk drawn under the budget overshoots it: the state is checked
per chunk), 0.5 gave 20 keys and 20%, the budget held; with no budget (``jit_share=1``) 471 keys
and 76% in 1,500 cases."""



def kernel_class(case: AttentionCase) -> tuple[bool, ...]:
    """The coarse class of the kernels a case needs: ``(causal, window_size_left set,
    window_size_right set, softcap set, backward)``, at most 32 classes (a backend's
    ``kernel_key`` adds dtype, head dims, GQA, layout and its own fields).

    Why: over the compile budget (`CompileBudget.gated_tasks`) a JIT backend runs only kernels
    already built, and its draws reuse its templates (`TEMPLATE_SHARE_OVER`), so the mask kinds of its
    first few cases were all it ever ran: on the H200 (2026-12-02, 99acd79;
    `benchmarks/gpu/results/2026-12-02-99acd79-default/manifest.json`) FA4's first causal case ran 122 s
    into a 600 s campaign (about 40 causal cases of 1,188), and the seed's class, a causal defect of
    FA4, was first stored at 268 s. The first kernel of each class is built even over the budget
    (``stats.compile_novel``): at most 32 per backend, fewer where it declares no windows or softcap."""
    return (*mask_kinds.switches(case), case.backward)  # each declared mask kind's switches (`oracle.mask_kinds`)



def is_compile_failure(backend: Backend | None, signature: str) -> bool:
    """Whether ``signature`` of ``backend`` is a JIT backend's compile failure (``error:`` one of
    `COMPILE_ERROR_TYPES`): its kernel key is quarantined (`CompileBudget.note_crashes`) and its
    bucket kept instead of shrunk (`fuzzer.loop.shrinker.Shrinker.minimise_claimed`)."""
    return (
        backend is not None and backend.jit_compiled
        and signature.startswith("error:") and signature.removeprefix("error:") in COMPILE_ERROR_TYPES
    )


class CompileBudget:
    """The compile gate, the kernel templates and the crash quarantine of one worker.

    Args:
        backends: every selected backend by name.
        usable: the backends usable now (fewer after a quarantine).
        stats: the worker's figures, read (``compile_s``, ``compile_by_backend``, ``kernel_keys``)
            and added to.
        jit_share: `WorkerConfig.jit_share`: None or 1 is no budget.
        lanes_on: whether fuzz cases run in lanes now (`WorkerConfig.lanes_on`).
        fuzz_elapsed_s: wall seconds since fuzzing began (since the worker started, before that).
        guard: what the backends' own methods are called through (None: directly).
    """

    def __init__(
        self,
        *,
        backends: dict[str, Backend],
        usable: Callable[[], list[Backend]],
        stats: WorkerStats,
        jit_share: float | None,
        lanes_on: Callable[[], bool],
        fuzz_elapsed_s: Callable[[], float],
        guard: Callable[[], PluginGuard | None] = lambda: None,
    ):
        self.backends = backends
        self._usable = usable
        self.stats = stats
        self.jit_share = jit_share
        self._lanes_on = lanes_on
        self._fuzz_elapsed_s = fuzz_elapsed_s
        self._guard = guard
        self.crashed_keys: set[tuple[str, tuple]] = set()  # (backend, kernel_key) that crashed or timed out in a fuzz case
        self.templates: dict[str, dict[KernelTemplate, None]] = {}  # JIT backend -> first-seen templates
        self.kernel_classes: dict[str, set[tuple[bool, ...]]] = {}  # JIT backend -> kernel_class of the cases it ran

    def chunk_commons(self, names: list[str], common: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The strategy arguments of each target in ``names`` for the next chunk: ``common``
        with the target's kernel templates and their share where it is a JIT backend under a
        budget (`TEMPLATE_SHARE_OVER` over it, `TEMPLATE_SHARE_UNDER` within it; `states`), else
        ``common`` itself. Counts the chunk in ``stats.template_chunks`` (``"over"`` when some
        JIT backend is over, ``"under"``, or ``"none"`` without a budget)."""
        states = self.states()
        state = "none" if states is None else ("over" if "over" in states.values() else "under")
        self.stats.template_chunks[state] += 1
        shares = {"over": TEMPLATE_SHARE_OVER, "under": TEMPLATE_SHARE_UNDER}
        return {
            name: self.with_templates(name, common, None if states is None else shares[states.get(name, "under")])
            for name in names
        }

    def states(self) -> dict[str, str] | None:
        """Where each usable JIT backend stands with the compile budget at this chunk: None
        without one (``jit_share`` None or 1: no templates); else ``{name: "over" | "under"}``,
        ``"over"`` (its draws take `TEMPLATE_SHARE_OVER`) when the chunk is over the budget for
        it: with lanes (``lanes_on``), when its own lane is (`over_budget`: each
        environment's compile seconds against the whole allowance), without lanes when every
        JIT backend's compile seconds together (``stats.compile_s``) pass the allowance
        (`state`); else ``"under"`` (`TEMPLATE_SHARE_UNDER`).

        Why per lane: with lanes a compile holds up only its own environment (the case goes on
        without it; `fuzzer.evaluate.Evaluator.evaluate`), so one backend's expensive kernels
        must not bind every other JIT backend's draws to their first templates. On the H200 (2026-12-02,
        1ef6565; `benchmarks/gpu/results/2026-12-02-1ef6565-default/manifest.json`) torch-flex's
        compiles kept the total over the budget in 214 of 216 chunks: fa4 (35 s of compile in 600 s) and
        te-fa4 (11 s) drew from 8 and 6 templates all run long, and only 50 of 3,882 stored cases were
        causal (the seed's TE-on-FA4 class was not found)."""
        allowed_s = self.allowance_s()
        if allowed_s is None:
            return None
        jit = [b.name for b in self._usable() if b.jit_compiled]
        if self._lanes_on():
            over = self.over_budget(allowed_s)
            return {name: "over" if name in over else "under" for name in jit}
        state = self.state(allowed_s)
        return {name: state for name in jit}

    def state(self, allowed_s: float) -> str:
        """Where this chunk stands with the compile budget without lanes, given the allowance
        ``allowed_s`` (`allowance_s`): ``"over"`` while ``stats.compile_s > allowed_s``
        (JIT draws take `TEMPLATE_SHARE_OVER`), else ``"under"`` (`TEMPLATE_SHARE_UNDER`).

        A controller in two states, checked per chunk: over the budget every draw for a JIT
        backend reuses a built kernel (compilation falls back under the share as cases
        accumulate), under it half do (a JIT backend compiles one kernel per key, and a free
        draw, which combines dtype, causal, windows, softcap, backward and layout, opens a new
        key nearly every time). See `TEMPLATE_SHARE_OVER` for why not 0.9."""
        return "over" if self.stats.compile_s > allowed_s else "under"

    def allowance_s(self) -> float | None:
        """Compile seconds the budget allows now: ``jit_share`` times the seconds since fuzzing
        began (since the worker started, before that); None without a budget (``jit_share``
        None or 1)."""
        if self.jit_share is None or self.jit_share >= 1:
            return None
        return self.jit_share * self._fuzz_elapsed_s()

    def _runs(self, backend: Backend, case: AttentionCase, variant: str) -> bool:
        """Whether ``backend`` declares ``variant`` runnable for ``case`` (False when its check
        fails: the evaluation records that)."""
        try:
            return not declared_reasons(backend, case, [variant], self._guard())[variant]
        except PluginCallError:
            return False

    def gated_tasks(self, case: AttentionCase) -> list[tuple[str, str]] | None:
        """The fuzz tasks of ``case`` under the compile gate and the crash quarantine: None
        (every applicable variant of every usable backend) unless some JIT backend is held back
        now (`over_budget`: the JIT backends' compile seconds in this run together past
        ``jit_share`` of the fuzzing wall time so far, checked per case) or some kernel key
        crashed (`note_crashes`); then every task but those a held-back backend would have to
        build a new kernel for (runnable, its ``kernel_key`` not built yet, no CP), counted in
        ``stats.compile_gated``, and those at a crashed key, counted in
        ``stats.crash_quarantined``. A new kernel of a `kernel_class` the backend has not run
        yet is built all the same (``stats.compile_novel``).

        Why: the templates steer draws *for* a JIT backend to built kernels, but every case runs
        on every backend that supports it, and a case drawn for a non-JIT target opened new FA4,
        TE-on-FA4 and flex keys at will: on the H200 (2026-12-01) compilation took 43% of the
        fuzzing time against a budget of 20%, and one new key holds the whole case up (the
        children run side by side, the slowest decides). Gated and quarantined tasks leave no
        result: they were not run."""
        allowed_s = self.allowance_s()
        over = self.over_budget(allowed_s)
        crashed = self.crashed_keys if case.cp_size == 1 else set()
        if not over and not crashed:
            return None
        tasks: list[tuple[str, str]] = []
        gated = 0
        held = over | {name for name, _ in crashed}  # backends some of whose tasks may be left out
        applicable, left_out = applicable_tasks(self._usable(), case, self._guard())  # as Evaluator.split_applicable
        for name, variant in applicable:
            backend = self.backends[name]
            if name in held and case.cp_size == 1 and self._runs(backend, case, variant):
                try:
                    key = backend.kernel_key(case, variant)
                except Exception:  # a plugin's key function must not stop the fuzz loop
                    key = None
                if key is not None and (name, key) in crashed:
                    self.stats.crash_quarantined[name] += 1
                    gated += 1
                    continue
                if name in over and key is not None and key not in self.stats.kernel_keys.get(name, ()):
                    if kernel_class(case) not in self.kernel_classes.get(name, ()):
                        self.stats.compile_novel[name] += 1  # the first kernel of its class: built
                    else:
                        self.stats.compile_gated[name] += 1
                        gated += 1
                        continue
            tasks.append((name, variant))
        if gated:  # explicit tasks: the evaluator counts no variant left out, so count them here
            self.stats.not_applicable.update(left_out)
        return tasks if gated else None

    def over_budget(self, allowed_s: float | None) -> set[str]:
        """The JIT backends the compile gate holds back now. With lanes (``lanes_on``): the JIT
        backends of each environment (one child, one lane) whose compile seconds together exceed
        ``allowed_s`` (see `states` for why per lane). Without lanes: none while
        the compile seconds of every JIT backend together are within ``allowed_s``; past it,
        each whose own compile seconds exceed its fair part, ``allowed_s`` divided by the number
        of usable JIT backends.

        Why together without lanes: the budget is a share of the wall time, and a case waits for
        its slowest child, so one backend's compilation holds every case it is in up. Gated each against the
        whole allowance, four JIT backends could compile for up to four times it: on the H200
        (2026-12-01, default campaign, jit_share 0.2) fa4 73.5 s, torch-flex 100 s, te-fa4 56.5 s
        and te-fused 16.7 s, 41% of the fuzzing time, and the gate held back 2 tasks. Why a fair
        part: a backend whose kernels build cheaply (te-fused's cuDNN graphs) is not held back
        by another's expensive ones."""
        if allowed_s is None:
            return set()
        jit = [b for b in self._usable() if b.jit_compiled]
        if self._lanes_on():  # each environment compiles in its own lane: each lane gets the allowance
            lanes: dict[str, list[str]] = {}
            for b in jit:
                lanes.setdefault(b.environment, []).append(b.name)
            return {
                name for names in lanes.values()
                if sum(self.stats.compile_by_backend[n] for n in names) > allowed_s for name in names
            }
        spent = {b.name: self.stats.compile_by_backend[b.name] for b in jit}
        if not jit or sum(spent.values()) <= allowed_s:
            return set()
        fair = allowed_s / len(jit)
        return {name for name, seconds in spent.items() if seconds > fair}

    def note_crashes(self, case: AttentionCase, results: list[CaseResult]) -> None:
        """Quarantine the ``kernel_key`` of every fuzz task of ``case`` that crashed (a fatal
        CUDA error) or timed out, and the keys of the backend's other variants on ``case``:
        later fuzz cases do not run that backend at those keys
        (`gated_tasks`, counted in ``stats.crash_quarantined``). Each such outcome cost
        a child restart (seconds for a CUDA process that imports FA4 or TE) or a whole timeout,
        and its bucket exists and is shrunk already; on the H200 (2026-12-01) one FA4 crash
        (head_dim 40, head_dim_v 128), met again and again by Hypothesis's target phase, kept
        the worker restarting children for most of a 240 s run.

        A JIT backend's ``error`` whose exception is a compile failure (`COMPILE_ERROR_TYPES`) is
        quarantined the same way: the kernel of that key does not build, so every later case at
        the key compiles and fails again (on the H200, 2026-12-01, FA4 4.0.0b36 at head_dim 112:
        131 ``error:MLIRError`` results on 40 cases of a 140 s run). Other errors are not: a
        library's refusal can depend on fields the key leaves out (lengths)."""
        if case.cp_size != 1:
            return
        for result in results:
            backend = self.backends.get(result.backend)
            compile_failed = result.status == "error" and is_compile_failure(backend, result.signature or "")
            if result.status not in ("crash", "timeout") and not compile_failed:
                continue
            if backend is None:
                continue
            # No more draws for the backend from this case's template: on the H200 (2026-12-02, cfec051;
            # benchmarks/gpu/results/2026-12-02-cfec051-default/manifest.json) crashed FA4 cases had
            # become templates, so its template draws kept landing on quarantined keys (2,896 fa4 tasks
            # quarantined; it ran 383 cases of 1,250 drawn for it).
            self.templates.get(result.backend, {}).pop(KernelTemplate.of(case), None)
            # every variant's key on this case: the variants of a backend call one library
            # entry with other mask arguments, and on the H200 (2026-12-02) FA4 crashed 11 times
            # in a 600 s run, through four variants of a few shapes, each crash a child restart
            for variant in dict.fromkeys([result.variant, *backend.variants]):
                try:
                    key = backend.kernel_key(case, variant)
                except Exception:  # a plugin's key function must not stop the fuzz loop
                    key = None
                if key is not None:
                    self.crashed_keys.add((result.backend, key))

    def with_templates(self, name: str, common: dict[str, Any], share: float | None) -> dict[str, Any]:
        """``common`` with backend ``name``'s kernel templates and ``share`` when it is a JIT
        backend with templates under a compile budget; else ``common`` itself."""
        templates = self.templates.get(name)
        if share is None or not templates or not self.backends[name].jit_compiled:
            return common
        return {**common, "kernel_templates": tuple(templates), "template_share": share}

    def track_kernels(self, case: AttentionCase, results: list[CaseResult]) -> None:
        """For each JIT backend that ran ``case`` (a result not ``unsupported``): add its
        ``kernel_key`` per variant run to ``stats.kernel_keys`` (a key counts when first seen)
        and, for a non-CP case it ran to a verdict (``pass`` or ``fail``), its `KernelTemplate`
        to the backend's templates (first-seen order, at most `MAX_KERNEL_TEMPLATES`); a crash,
        timeout or error makes no template (`note_crashes` removes one). The case's
        `kernel_class` counts as tried for the backend (`gated_tasks`). Compile seconds
        go to ``stats.compile_by_backend``."""
        for r in results:
            if r.compile_ms:
                self.stats.compile_by_backend[r.backend] += r.compile_ms / 1000.0
            backend = self.backends.get(r.backend)
            if r.status == "unsupported" or backend is None or not backend.jit_compiled:
                continue
            try:
                key = backend.kernel_key(case, r.variant)
            except Exception:  # a plugin's key function must not stop the fuzz loop
                key = ("unkeyed", r.variant)
            self.stats.kernel_keys.setdefault(r.backend, set()).add(key)
            self.kernel_classes.setdefault(r.backend, set()).add(kernel_class(case))
            if case.cp_size == 1 and r.status in ("pass", "fail"):  # a kernel that ran to a verdict
                templates = self.templates.setdefault(r.backend, {})
                if len(templates) < MAX_KERNEL_TEMPLATES:
                    templates.setdefault(KernelTemplate.of(case), None)


    def is_crashed(self, backend: Backend, case: AttentionCase, variant: str) -> bool:
        """Whether ``backend``'s ``variant`` on ``case`` (non-CP) is at a kernel key that crashed,
        timed out or did not build in a fuzz case (`note_crashes`); False when its key function
        raises (a plugin's key function must not stop a confirmation)."""
        if case.cp_size != 1 or not self.crashed_keys:
            return False
        try:
            kernel = backend.kernel_key(case, variant)
        except Exception:  # a plugin's key function must not stop the confirmation
            kernel = None
        return kernel is not None and (backend.name, kernel) in self.crashed_keys
