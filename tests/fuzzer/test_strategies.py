"""Tests of fuzzer/strategies.py: bounds are honoured, checked eagerly, and edges are reachable."""

import pytest
from hypothesis import find, given, settings

from fuzzer.backends.base import Capabilities
from fuzzer.strategies import KernelTemplate, StrategyArgumentError, attention_cases, merge_capabilities, seqlens, usable_templates

CAPS = Capabilities(
    dtypes=("bfloat16", "float16"),
    qkv_formats=("bshd", "thd"),
    max_head_dim=256,
    head_dim_multiple=8,
    windows=True,
    causal_alignments=("bottom_right",),
    max_seqlen=300,
)


@given(attention_cases(capabilities=CAPS, max_batch_size=3, max_heads_kv=2, max_work=2**22))
def test_drawn_cases_stay_inside_the_declared_capabilities(case):
    assert case.dtype in CAPS.dtypes
    assert case.qkv_format in CAPS.qkv_formats
    assert case.head_dim % 8 == 0 and case.head_dim <= 256
    assert case.seqlen_q <= 300 and case.seqlen_k <= 300
    assert case.batch_size <= 3 and case.num_heads_kv <= 2
    assert case.softcap is None  # CAPS has no softcap
    if case.causal:
        assert case.causal_alignment == "bottom_right"


def test_bad_bounds_are_rejected_before_anything_is_drawn():
    with pytest.raises(StrategyArgumentError, match="max_batch_size"):
        attention_cases(capabilities=CAPS, max_batch_size=0)
    with pytest.raises(StrategyArgumentError, match="max_seqlen"):
        seqlens(0)
    with pytest.raises(StrategyArgumentError, match="capabilities"):
        merge_capabilities([])


@pytest.mark.parametrize(
    "predicate",
    [
        lambda c: c.seqlen_q == 1 and c.seqlen_k > 1,
        lambda c: c.seqlen_q in (127, 129) and c.seqlen_k == c.seqlen_q,
        lambda c: c.seqlen_q > c.seqlen_k and c.causal,
        lambda c: c.window_size_left == 0 and c.window_size_right is not None,
        lambda c: c.num_heads == 4 * c.num_heads_kv,
        lambda c: c.is_varlen and len(set(c.seqlens_q)) > 1,
        lambda c: c.head_dim % 16 != 0,
    ],
    ids=["seqlen1", "tile-edge", "sq>sk-causal", "window0", "gqa4", "varlen-uneven", "head_dim-not-16"],
)
def test_edge_regions_are_reachable(predicate):
    found = find(
        attention_cases(capabilities=CAPS, max_batch_size=3, max_heads_kv=2),
        predicate,
        settings=settings(max_examples=2000, database=None),
    )
    assert predicate(found)


def test_merged_capabilities_are_the_union():
    a = Capabilities(dtypes=("float16",), windows=False, max_head_dim=128, head_dim_multiple=8)
    b = Capabilities(dtypes=("bfloat16",), windows=True, max_head_dim=256, head_dim_multiple=16)
    merged = merge_capabilities([a, b])
    assert merged.dtypes == ("bfloat16", "float16")
    assert merged.windows and merged.max_head_dim == 256 and merged.head_dim_multiple == 8


def test_shrinking_direction_is_toward_the_smallest_case():
    smallest = find(attention_cases(capabilities=CAPS), lambda c: True, settings=settings(database=None))
    assert (smallest.batch_size, smallest.num_heads, smallest.seqlen_q, smallest.seqlen_k) == (1, 1, 1, 1)
    assert not smallest.causal and smallest.window_size_left is None and smallest.seed == 0


# --------------------------------------------------------------------------- kernel templates
JIT_CAPS = Capabilities(
    dtypes=("bfloat16", "float16"),
    qkv_formats=("bshd", "thd"),
    max_head_dim=256,
    head_dim_multiple=8,
    windows=True,
    softcap=True,
    causal_alignments=("bottom_right", "top_left"),
    max_seqlen=300,
)
TEMPLATES = (
    KernelTemplate("bfloat16", "thd", 64, 64, 2, True, True, False, True, True, "bottom_right"),
    KernelTemplate("float32", "bshd", 64, 64, 1, False, False, False, False, False),  # no float32 here
    KernelTemplate("float16", "bshd", 128, 128, 1, False, False, True, False, False, "top_left"),
    KernelTemplate("float16", "bshd", 512, 512, 1, False, False, False, False, False),  # above max_head_dim
    KernelTemplate("float16", "bshd", 100, 100, 1, False, False, False, False, False),  # not a multiple of 8
    KernelTemplate("bfloat16", "sbhd", 64, 64, 1, False, False, False, False, False),  # no sbhd
)
USABLE = (TEMPLATES[0], TEMPLATES[2])


def test_only_the_templates_the_capabilities_take_are_used():
    assert usable_templates(TEMPLATES, JIT_CAPS) == USABLE
    no_gqa_no_backward = Capabilities(**{**JIT_CAPS.__dict__, "gqa": False, "backward": False})
    assert usable_templates(TEMPLATES, no_gqa_no_backward) == (TEMPLATES[2],)
    assert usable_templates(TEMPLATES, JIT_CAPS, allow_backward=False) == (TEMPLATES[2],)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(attention_cases(capabilities=JIT_CAPS, max_batch_size=3, kernel_templates=TEMPLATES, template_share=1.0))
def test_with_template_share_1_every_case_has_a_usable_templates_kernel_fields(case):
    assert [t for t in USABLE if t.matches(case)], case.describe()
    assert case.cp_size == 1


def test_template_draws_vary_everything_else_and_a_share_mixes_in_free_draws():
    seen = {"lengths": set(), "free": 0}

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(attention_cases(capabilities=JIT_CAPS, kernel_templates=USABLE, template_share=0.5))
    def draw(case):
        if any(t.matches(case) for t in USABLE):
            seen["lengths"].add((case.seqlen_q, case.seqlen_k))
        else:
            seen["free"] += 1

    draw()
    assert len(seen["lengths"]) > 10 and seen["free"] > 20, seen


def test_without_usable_templates_the_draw_is_the_one_without_templates():
    def cases(**kwargs):
        out = []

        @settings(max_examples=50, derandomize=True, database=None, deadline=None)
        @given(attention_cases(capabilities=JIT_CAPS, **kwargs))
        def draw(case):
            out.append(case)

        draw()
        return out

    plain = cases()
    assert cases(kernel_templates=TEMPLATES[3:], template_share=1.0) == plain  # none usable
    assert cases(kernel_templates=USABLE, template_share=0.0) == plain


def test_a_bad_template_share_or_template_is_rejected_before_drawing():
    with pytest.raises(StrategyArgumentError, match="template_share"):
        attention_cases(capabilities=JIT_CAPS, kernel_templates=USABLE, template_share=1.5)
    with pytest.raises(StrategyArgumentError, match="kernel_templates"):
        attention_cases(capabilities=JIT_CAPS, kernel_templates=(("bfloat16", 64),))


def test_seeds_come_from_the_pool_seven_times_in_eight_reach_any_32_bit_seed_and_shrink_to_0():
    """`seeds`: most cases drawn have a pooled seed (their input streams are cached on the CPU), a
    seed outside the pool and a large one are still reachable, and the simplest seed is 0. (Drawn
    alone, the pool's few choice sequences are soon used up: Hypothesis does not draw one twice.)"""
    from hypothesis import HealthCheck, Phase
    from hypothesis import seed as fixed_seed

    from fuzzer.strategies import CPU_BOUNDS, GPU_BOUNDS, seeds

    SEED_POOL = CPU_BOUNDS.seed_pool
    assert SEED_POOL == 8 and GPU_BOUNDS.seed_pool == 0

    drawn = []

    @fixed_seed(7)
    @settings(max_examples=800, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(attention_cases(capabilities=CAPS, max_batch_size=3, max_heads_kv=2, seed_pool=SEED_POOL))
    def collect(case):
        assert 0 <= case.seed < 2**32
        drawn.append(case.seed)

    collect()
    pooled = sum(value < SEED_POOL for value in drawn) / len(drawn)
    assert 0.75 <= pooled < 0.99, pooled
    assert find(seeds(SEED_POOL), lambda s: s >= SEED_POOL, settings=settings(database=None)) == SEED_POOL
    assert find(seeds(SEED_POOL), lambda s: s > 2**31, settings=settings(database=None, max_examples=2000)) > 2**31
    assert find(seeds(SEED_POOL), lambda s: True, settings=settings(database=None)) == 0
    unpooled = []

    @fixed_seed(7)
    @settings(max_examples=200, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(attention_cases(capabilities=CAPS, max_batch_size=3, max_heads_kv=2))
    def collect_unpooled(case):
        unpooled.append(case.seed)

    collect_unpooled()
    assert sum(seed < SEED_POOL for seed in unpooled) < len(unpooled) / 2  # no pool by default (the GPU's)
    with pytest.raises(StrategyArgumentError, match="seed_pool"):
        attention_cases(capabilities=CAPS, seed_pool=-1)


def test_a_second_run_of_draws_builds_no_new_strategy_object() -> None:
    """The inner strategies a case's draw builds from earlier choices (``sampled_from``, bounded
    ``integers``, the seed pool, the lists of thd lengths) are kept per arguments, so drawing the
    same cases again validates no new strategy object (Hypothesis validates each new object: a
    quarter of the drawing's samples in a CPU fuzz run); the cases drawn are the same."""
    from hypothesis import HealthCheck, Phase
    from hypothesis.strategies._internal.strategies import SearchStrategy

    caps = Capabilities(dtypes=("float32", "bfloat16"), qkv_formats=("bshd", "thd"), gqa=True, windows=True,
                        head_dim_v_differs=True, softcap=True, lse=True)

    def draw_all() -> list:
        cases = []

        @settings(max_examples=150, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(attention_cases(capabilities=caps, max_work=2**20, seed_pool=8))
        def collect(case):
            cases.append(case.to_json())

        collect()
        return cases

    first = draw_all()
    validated = []
    original = SearchStrategy.validate

    def counting(self):
        if not self.validate_called:
            validated.append(type(self).__name__)
        return original(self)

    SearchStrategy.validate = counting
    try:
        again = draw_all()
    finally:
        SearchStrategy.validate = original
    assert again == first
    # the top-level strategy and Hypothesis's own wrappers are new each run; no per-case ones
    assert len(validated) < 10, validated
