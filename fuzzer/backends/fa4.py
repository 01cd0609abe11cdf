"""FlashAttention 4 (flash-attn-4, CuTe DSL) adapter: ``flash_attn.cute.interface``.

What the library expects (read in flash-attn-4 4.0.0b36, cross-checked against the 4.0.0b3 and
every 4.0.0b11 .. 4.0.0b35 wheel and upstream commit 66ee1b5):

* ``flash_attn_func(q, k, v, *, softmax_scale=None, causal=False, window_size=(None, None),
  softcap=0.0, ..., return_lse=False)`` on ``[batch_size, seqlen, heads, dim]`` tensors and
  ``flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  ...)`` on packed ``[total, heads, dim]`` tensors. Both return ``(out, lse)``; ``lse`` is float32,
  natural log, ``[batch_size, num_heads, seqlen_q]`` (``[num_heads, total_q]`` varlen), and is None
  unless ``return_lse=True`` or an input requires grad.
* Unbounded window sides are ``None``. ``causal`` sets ``window_size_right = 0``. Causal and
  window bounds are aligned to the bottom-right corner (``seqlen_k - seqlen_q`` offset), as in FA2.
* ``_resolve_causal_local_window`` turns (causal, left, right) into (causal, local, left, right).
  Up to 4.0.0b29 it applied causal first and then widened to (None, None) when
  ``left + right < 0``, so the FA2/TE sentinel ``(-1, 0)`` collapsed to plain causal. From 4.0.0b30
  (flash-attention PR #2490, released 2026-09-09) it widens only when *both* sides are negative,
  then applies causal: ``(True, -1, 0)`` becomes ``local`` with left bound ``-1``, an empty band,
  so out is all zeros and lse is -inf (the seed bug, see ``shared/seed/000_b489f7c1bd22712f.txt``).
* Supported: fp16/bf16; head dims multiple of 8; SM90 ``8 <= d, d_v <= 256``; SM100/SM110
  ``8 <= d, d_v <= 128`` or (192, 128), (256, 256), (64 | 512, 512) (``_validate_head_dims``);
  GQA/MQA; softcap; backward through autograd (``FlashAttnFunc.backward``).

API drift handled here (never by version string):

* The 4th positional parameter was ``softmax_scale`` in 4.0.0b3 and became ``qv`` in 4.0.0b11, so
  every argument after q, k, v is passed by keyword.
* ``return_lse`` exists in every PyPI build (4.0.0b3..4.0.0b36) but not in the pre-release
  upstream interface (commit 66ee1b5, July 2025), whose varlen function also had no
  ``max_seqlen_q/k``. Keywords absent from ``inspect.signature`` are dropped when optional
  (``return_lse``, ``max_seqlen_*``) and refused (`UnsupportedCaseError`) when they carry the mask.
* A result that is a tuple/list is ``(out, lse, ...)``; a bare tensor is ``out`` (lse None).
* Every build 4.0.0b11 .. 4.0.0b36 (all 26 wheels read) takes every keyword the adapter sends
  (``softmax_scale``, ``causal``, ``window_size``, ``softcap``, ``return_lse``; varlen also
  ``cu_seqlens_q/k``, ``max_seqlen_q/k``) and returns ``FlashAttnFunc.apply(...)`` = ``(out,
  lse)``. Later parameters only: ``mask_mod``/``block_sparse_tensors`` in the varlen function
  (b13), ``aux_scalars`` (b17), ``scheduler_metadata``/``seqlen_k_per_split``/
  ``disable_scheduler_metadata`` (varlen, b25), ``gather_bwd_recompute_p``/
  ``gather_bwd_token_chunk`` (b32); the adapter sends none of them. `fa4_build_mismatch` checks
  that the imported module is the build whose version is recorded (``extra`` has both).
* SM90 backward with GQA and ``head_dim != head_dim_v`` asserts in every build
  (`fa4_sm90_backward_reasons`).

Variants (the same mask, encoded the way different callers encode it):

* ``native``: FA4's own convention. ``causal=case.causal``, ``window_size=(left, right)`` with
  ``None`` for an unbounded side.
* ``te_style``: exactly what TransformerEngine 2.20.2 passes to ``flash_attn_func_v4``
  (``backends.py`` ``FlashAttention.forward``): ``causal=True`` and ``window_size=(left or -1, 0)``
  for causal masks (``check_set_window_size``), ``causal=False`` and ``(-1, -1)`` or
  ``(left, right)`` otherwise. Not defined for one-sided non-causal windows (TE refuses them).
* ``minus1_unbounded``: the FA2 convention carried over: each unbounded side is ``-1``, causality
  only through the ``causal`` flag (``causal=True, window_size=(-1, -1)`` for plain causal).
* ``causal_as_window``: causality expressed only through the window: ``causal=False``,
  ``window_size=(left or None, 0)``. Causal cases only.

A variant whose call is identical to an earlier variant's call for a case is reported unsupported
("same call as ..."), so no kernel call is made twice under two names.

Source: Dao-AILab/flash-attention ``flash_attn/cute/interface.py`` (flash-attn-4 4.0.0b36 wheel;
also 4.0.0b3/b11/b29/b30 wheels and upstream commit 66ee1b5), ``flash_attn/cute/mask.py``
(4.0.0b36); NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention/dot_product_attention/
backends.py`` and ``utils.py`` (transformer-engine 2.20.2 wheel).

The helpers this adapter shares with ``fa2.py``, ``te.py`` and ``sdpa.py`` (``CompileTimer``,
``library_layout_qkv``, ``canonical_lse``, ``call_with_signature``, the repro template) are in
`fuzzer.backends._common`; the FA4 build identity (`fa4_imported_build`, `fa4_build_mismatch`)
stays here, where the FA4 import is known.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from typing import Any, ClassVar

from fuzzer.backends._common import (
    FA4_DESIGN,
    CompileTimer,
    call_with_signature,
    canonical_lse,
    cuda_arch_major,
    describe_call,
    distribution_version,
    fa_repro_source,
    is_declared_refusal,
    is_one_sided_window,
    library_layout_qkv,
)
from fuzzer.backends.base import (
    Backend,
    BackendOutput,
    Capabilities,
    ReproCall,
    UnsupportedCaseError,
    run_with_grad,
)
from oracle.config import AttentionCase
from oracle.design import Design

FA4_DISTRIBUTION = "flash-attn-4"
FA4_MODULE = "flash_attn.cute.interface"
FA4_VARIANTS = ("native", "te_style", "minus1_unbounded", "causal_as_window")
#: Compute-capability majors the adapter targets: Hopper (sm90) and Blackwell (sm100, sm103).
FA4_ARCH_MAJORS = (9, 10)
#: Keywords that carry the mask or the inputs: dropping one would change what is computed.
FA4_ESSENTIAL_KWARGS = frozenset({"causal", "window_size", "softmax_scale", "softcap", "cu_seqlens_q", "cu_seqlens_k"})

# The FA2/TE sentinel for an unbounded window side. Only adapters may spell it.
_MINUS1 = -1


def _or(value: int | None, sentinel: int | None) -> int | None:
    """``value`` unless it is None (unbounded), then ``sentinel``."""
    return sentinel if value is None else value


def fa4_window_args(case: AttentionCase, variant: str) -> tuple[bool, tuple[int | None, int | None]]:
    """The ``(causal, window_size)`` pair FA4 receives for ``case`` under ``variant``.

    Args:
        case: the case.
        variant: one of ``FA4_VARIANTS``.

    Returns:
        ``(causal, (window_size_left, window_size_right))`` in FA4's argument conventions.

    Raises:
        ValueError: the variant is unknown or has no encoding for this case (see
            `fa4_variant_reasons`).
    """
    left, right = case.window_size_left, case.window_size_right
    if variant == "native":
        return case.causal, (left, right)
    if variant == "te_style":
        if case.causal:
            return True, (_or(left, _MINUS1), 0)
        if is_one_sided_window(case):
            raise ValueError("te_style: TransformerEngine cannot express a one-sided non-causal window")
        return False, (_or(left, _MINUS1), _or(right, _MINUS1))
    if variant == "minus1_unbounded":
        return case.causal, (_or(left, _MINUS1), _or(right, _MINUS1))
    if variant == "causal_as_window":
        if not case.causal:
            raise ValueError("causal_as_window: the case is not causal")
        return False, (left, 0)
    raise ValueError(f"unknown FA4 variant {variant!r}; expected one of {FA4_VARIANTS}")


def fa4_call_kwargs(case: AttentionCase, variant: str) -> dict[str, Any]:
    """Every non-tensor keyword FA4 receives for ``case`` under ``variant``.

    ``cu_seqlens_q``/``cu_seqlens_k`` tensors are added at call time for thd cases.

    Returns:
        e.g. ``{"softmax_scale": 0.125, "causal": True, "window_size": (-1, 0),
        "return_lse": True}`` (plus ``softcap`` when set and ``max_seqlen_q``/``max_seqlen_k`` for
        thd).

    Raises:
        ValueError: as `fa4_window_args`.
    """
    causal, window_size = fa4_window_args(case, variant)
    kwargs: dict[str, Any] = {
        "softmax_scale": case.softmax_scale,
        "causal": causal,
        "window_size": window_size,
    }
    if case.softcap is not None:
        kwargs["softcap"] = case.softcap
    if case.is_varlen:
        kwargs["max_seqlen_q"] = case.seqlen_q
        kwargs["max_seqlen_k"] = case.seqlen_k
    kwargs["return_lse"] = True
    return kwargs


def fa4_variant_reasons(case: AttentionCase, variant: str) -> list[str]:
    """Why ``variant`` has no distinct encoding of ``case`` (empty = it has one).

    A variant is meaningless when it cannot encode the mask (``causal_as_window`` without
    causal, ``te_style`` for a one-sided non-causal window) or when it sends exactly the call an
    earlier variant in `FA4_VARIANTS` sends.
    """
    if variant not in FA4_VARIANTS:
        return []  # the base class reports unknown variants
    try:
        mine = fa4_call_kwargs(case, variant)
    except ValueError as exc:
        return [str(exc)]
    for earlier in FA4_VARIANTS[: FA4_VARIANTS.index(variant)]:
        try:
            theirs = fa4_call_kwargs(case, earlier)
        except ValueError:
            continue
        if theirs == mine:
            return [f"{variant}: sends the same call as variant {earlier!r} for this case"]
    return []


def fa4_head_dim_reasons(head_dim: int, head_dim_v: int, arch_major: int | None) -> list[str]:
    """FA4's head-dimension limits for an architecture (None = unknown: any supported arch).

    Source: flash-attn-4 4.0.0b36 ``interface.py`` ``_validate_head_dims``; TransformerEngine
    2.20.2 ``utils.py`` (symmetric 512 on SM100 exceeds the generic kernel's TMEM).
    """
    reasons = []  # divisibility by 8 is declared in FA4Backend.capabilities.head_dim_multiple

    def sm90_ok() -> bool:
        return 8 <= head_dim <= 256 and 8 <= head_dim_v <= 256

    def sm100_ok() -> bool:
        return (
            (8 <= head_dim <= 128 and 8 <= head_dim_v <= 128)
            or (head_dim, head_dim_v) in ((192, 128), (256, 256), (64, 512))
        )

    if arch_major == 9 and not sm90_ok():
        reasons.append(f"FA4 on SM90 supports 8 <= head_dim, head_dim_v <= 256, got ({head_dim}, {head_dim_v})")
    elif arch_major in (10, 11) and not sm100_ok():
        reasons.append(
            f"FA4 on SM100 supports head dims 8..128, (192, 128), (256, 256) or (64, 512), "
            f"got ({head_dim}, {head_dim_v})"
        )
    elif arch_major is None and not (sm90_ok() or sm100_ok()):
        reasons.append(f"(head_dim, head_dim_v) = ({head_dim}, {head_dim_v}) is supported on no FA4 architecture")
    return reasons


def fa4_sm90_backward_reasons(case: AttentionCase, arch_major: int | None) -> list[str]:
    """FA4's SM90 backward limits that its interface does not validate up front.

    ``FlashAttentionBackwardSm90.__init__`` asserts "GQA backward requires head_dim == head_dim_v"
    when ``qhead_per_kvhead > 1`` (``flash_bwd_sm90.py``, identical in every build 4.0.0b11 ..
    4.0.0b36); it surfaces as an AssertionError at the first backward call.
    """
    if arch_major != 9 or not case.backward:
        return []
    if case.num_heads != case.num_heads_kv and case.head_dim != case.head_dim_v:
        return ["FA4's SM90 backward does not support GQA/MQA with head_dim != head_dim_v"]
    return []


def fa4_build_mismatch(interface: Any | None = None) -> str | None:
    """Why the imported ``flash_attn.cute.interface`` is not the flash-attn-4 build its metadata
    names (None when they agree or when it cannot be told).

    Bisection puts one build's folder before another on ``sys.path``; ``flash_attn`` is a namespace
    package in flash-attn-4 wheels, so an installed FlashAttention 2 (a regular ``flash_attn``
    package) or a stale ``sys.path`` order would silently run another build than the recorded
    version. The metadata's own location of ``flash_attn/cute/interface.py`` decides.
    """
    if interface is None:
        interface = sys.modules.get(FA4_MODULE)
    module_file = getattr(interface, "__file__", None)
    if not module_file:
        return None
    try:
        dist = importlib.metadata.distribution(FA4_DISTRIBUTION)
        expected = os.path.realpath(str(dist.locate_file("flash_attn/cute/interface.py")))
    except Exception:  # noqa: BLE001 - no metadata or an unusual installation: cannot tell
        return None
    if not os.path.exists(expected):
        return None  # e.g. an editable install: the metadata does not locate the sources
    actual = os.path.realpath(module_file)
    if actual == expected:
        return None
    return (
        f"{FA4_MODULE} was imported from {actual}, but the {FA4_DISTRIBUTION} metadata found first "
        f"(version {dist.version}) belongs to {expected}: results would be recorded under the wrong build"
    )


def fa4_imported_build(interface: Any | None = None) -> dict[str, str]:
    """The flash-attn-4 build ``flash_attn.cute`` was actually imported from: ``flash_attn_4``
    (the version of the ``flash_attn_4-*.dist-info`` beside the imported files, or ``"unknown"``)
    and ``flash_attn_4_module`` (the imported ``flash_attn/cute`` directory). Empty when it is not
    imported (nothing is imported here).

    The metadata found first on ``sys.path`` can belong to another folder than the module (FA2's
    regular ``flash_attn`` package shadows FA4's namespace portions: ``shared/gpu/FA2.md``), so the
    version is read next to the imported file, never from ``importlib.metadata.version``.
    """
    if interface is None:
        interface = sys.modules.get(FA4_MODULE)
    module_file = getattr(interface, "__file__", None)
    if not module_file:
        return {}
    module_dir = os.path.dirname(os.path.realpath(module_file))
    version = "unknown"
    for candidate in (module_file, os.path.realpath(module_file)):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(candidate))))
        for dist in importlib.metadata.distributions(path=[root]):
            if (dist.metadata["Name"] or "").lower().replace("_", "-") != FA4_DISTRIBUTION:
                continue
            located = os.path.realpath(str(dist.locate_file("flash_attn/cute/interface.py")))
            if located == os.path.realpath(module_file):
                version = dist.version
                break
        if version != "unknown":
            break
    return {"flash_attn_4": version, "flash_attn_4_module": module_dir}


# ---------------------------------------------------------------------------- the backend
class FA4Backend(Backend):
    """flash-attn-4 called through ``flash_attn.cute.interface`` (see the module docstring)."""

    name: ClassVar[str] = "fa4"
    variants: ClassVar[tuple[str, ...]] = FA4_VARIANTS
    device: ClassVar[str] = "cuda"
    environment: ClassVar[str] = "fa4"
    jit_compiled: ClassVar[bool] = True
    packages: ClassVar[tuple[str, ...]] = (FA4_DISTRIBUTION, "nvidia-cutlass-dsl", "torch")
    design: ClassVar[Design] = FA4_DESIGN
    capabilities: ClassVar[Capabilities] = Capabilities(
        dtypes=("bfloat16", "float16"),
        qkv_formats=("bshd", "sbhd", "thd"),
        max_head_dim=512,
        head_dim_multiple=8,
        head_dim_v_differs=True,
        gqa=True,
        causal_alignments=("bottom_right",),
        windows=True,
        softcap=True,
        backward=True,
        lse=True,
    )

    def __init__(self) -> None:
        self._timer = CompileTimer()

    # ------------------------------------------------------------------ discovery
    def quick_availability(self) -> str | None:
        """Package, CUDA device and architecture, without importing FA4."""
        if distribution_version(FA4_DISTRIBUTION) is None:
            return f"{FA4_DISTRIBUTION} is not installed (pip install {FA4_DISTRIBUTION})"
        reason = Backend.availability(self)
        if reason:
            return reason
        major = cuda_arch_major()
        if major not in FA4_ARCH_MAJORS:
            return f"FA4 targets SM90/SM100 (compute capability major {FA4_ARCH_MAJORS}), this GPU is sm{major}x"
        return None

    def availability(self) -> str | None:
        """None when FA4 can run here, else why not (package, CUDA, architecture, import, and
        whether the imported build is the one its metadata names)."""
        reason = self.quick_availability()
        if reason:
            return reason
        try:
            interface = importlib.import_module(FA4_MODULE)
        except Exception as exc:  # noqa: BLE001 - any import failure makes the backend unusable
            return f"cannot import {FA4_MODULE}: {type(exc).__name__}: {exc}"
        return fa4_build_mismatch(interface)

    def runtime_versions(self) -> dict[str, str]:
        """The FA4 build imported in this process (`fa4_imported_build`)."""
        return fa4_imported_build()

    def unsupported_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """Base checks, window alignment, head dims for this GPU, and the variant's meaning."""
        reasons = super().unsupported_reasons(case, variant)
        has_window = case.window_size_left is not None or case.window_size_right is not None
        if has_window and not case.causal and case.causal_alignment != "bottom_right":
            reasons.append("FA4 aligns sliding windows bottom-right only")
        arch_major = cuda_arch_major()
        reasons.extend(fa4_head_dim_reasons(case.head_dim, case.head_dim_v, arch_major))
        reasons.extend(fa4_sm90_backward_reasons(case, arch_major))
        reasons.extend(fa4_variant_reasons(case, variant))
        return reasons

    def inapplicable_reasons(self, case: AttentionCase, variant: str) -> list[str]:
        """`fa4_variant_reasons`: the variant cannot encode the mask, or sends an earlier
        variant's call."""
        return fa4_variant_reasons(case, variant)

    def kernel_key(self, case: AttentionCase, variant: str) -> tuple:
        """The base key plus the GQA ratio and the q-tile staging FA4 compiles in."""
        return super().kernel_key(case, variant) + (case.group_size, case.seqlen_q * case.group_size > 128)

    # ------------------------------------------------------------------ execution
    def _interface(self) -> Any:
        return importlib.import_module(FA4_MODULE)

    def run(self, case: AttentionCase, inputs: Any, variant: str) -> BackendOutput:
        """Call flash_attn_func / flash_attn_varlen_func once per the variant's encoding.

        Raises:
            UnsupportedCaseError: the build lacks an essential keyword, or FA4 refused the case
                with NotImplementedError / an "unsupported" assertion.
        """
        interface = self._interface()
        func_name = "flash_attn_varlen_func" if case.is_varlen else "flash_attn_func"
        func = getattr(interface, func_name)
        kwargs = fa4_call_kwargs(case, variant)
        tensor_kwargs = (
            {"cu_seqlens_q": inputs.cu_seqlens_q, "cu_seqlens_k": inputs.cu_seqlens_k} if case.is_varlen else {}
        )
        facts: dict[str, Any] = {}

        def attention(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
            q_, k_, v_ = library_layout_qkv(case, q, k, v)
            try:
                result, dropped = call_with_signature(
                    func, (q_, k_, v_), {**kwargs, **tensor_kwargs}, FA4_ESSENTIAL_KWARGS
                )
            except UnsupportedCaseError:
                raise
            except Exception as exc:
                if is_declared_refusal(exc):
                    raise UnsupportedCaseError(f"flash-attn-4 refused the case: {type(exc).__name__}: {exc}") from exc
                raise
            if isinstance(result, (tuple, list)):
                out, lse = result[0], (result[1] if len(result) > 1 else None)
                facts["fa4_returns"] = f"{type(result).__name__} of {len(result)}"
            else:
                out, lse = result, None
                facts["fa4_returns"] = "tensor"
            facts["fa4_dropped_kwargs"] = ",".join(dropped)
            return out, canonical_lse(case, lse)

        def once() -> tuple:
            return run_with_grad(attention, case, inputs)

        (out, lse, dq, dk, dv), compile_ms = self._timer.run(self.kernel_key(case, variant), once, inputs.q)
        extra = {
            "call": describe_call(func_name, kwargs),
            "flash_attn_4_version": distribution_version(FA4_DISTRIBUTION) or "unknown",
            "flash_attn_4_module": str(getattr(interface, "__file__", None) or "unknown"),
            **facts,
        }
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv, compile_ms=compile_ms, extra=extra)


    def repro(self, case: AttentionCase, variant: str) -> ReproCall:
        """The exported repro's call: `fa4_call_kwargs` of the variant, as `run` sends them.

        Raises:
            ValueError: the variant cannot encode ``case`` (`fa4_call_kwargs`).
        """
        return ReproCall(
            source=FA4_REPRO_SOURCE,
            values={"fa4_kwargs": fa4_call_kwargs(case, variant), "arch_majors": tuple(FA4_ARCH_MAJORS)},
            packages=(FA4_DISTRIBUTION,),
        )


FA4_REPRO_SOURCE = fa_repro_source(
    constants="FA4_KWARGS = $fa4_kwargs\nFA4_ARCH_MAJORS = $arch_majors",
    kwargs_name="FA4_KWARGS",
    check_environment=(
        '    require_cuda(FA4_ARCH_MAJORS, "flash-attn-4")\n'
        '    pytest.importorskip("flash_attn.cute.interface", reason="flash-attn-4 is not installed")'
    ),
    import_line="from flash_attn.cute import interface",
    module="interface",
)
"""`FA4Backend.repro`'s source (a `ReproCall`; slots ``fa4_kwargs``, ``arch_majors``)."""

def builtin_backends() -> list[Backend]:
    """The FA4 backend instances this module provides."""
    return [FA4Backend()]


__all__ = [
    "FA4Backend",
    "FA4_VARIANTS",
    "builtin_backends",
    "fa4_build_mismatch",
    "fa4_call_kwargs",
    "fa4_head_dim_reasons",
    "fa4_imported_build",
    "fa4_sm90_backward_reasons",
    "fa4_variant_reasons",
    "fa4_window_args",
]
