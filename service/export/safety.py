"""Only validated literals reach a generated repro file.

Names and signatures must match strict patterns (`NAME_PATTERN`, `SIGNATURE_PATTERN`,
`check_names`), the stored case is validated again (`validated_case`), every value goes into the
file through `literal` (``None``, ``bool``, ``int``, finite ``float``, strings of a small alphabet
and tuples/lists/dicts of those), and `fill_template` proves with `check_only_literals` that the
rendered file's syntax tree equals the template's except at the ``$slots``, where only literals
(`ast.literal_eval`) stand. Every refusal is an `ExportError` naming the field (HTTP 422, exit 2).
"""

from __future__ import annotations

import ast
import math
import re
import string
from typing import Any

from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.errors import FieldValidationError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
"""Backend and variant names (as in `fuzzer.builds.corpus`)."""
SIGNATURE_PATTERN = re.compile(r"^[A-Za-z0-9_]{1,64}(:[A-Za-z0-9_.]{1,128})?$")
"""Failure signatures such as ``out:all_zero``, ``crash``, ``error:RuntimeError``."""
_SAFE_STRING = re.compile(r"^[A-Za-z0-9_.:+\-]{0,200}$")
_DOC_TEXT = re.compile(r"^[\x20-\x7e\n]*$")


class ExportError(FieldValidationError):
    """A repro cannot be generated; ``field`` names the offending input (HTTP 422)."""


def literal(value: Any, *, where: str = "value") -> str:
    """Python source for ``value``, which must be plain data.

    Accepted: ``None``, ``bool``, ``int``, finite ``float``, ``str`` of letters, digits and
    ``_ . : + -`` (at most 200), and ``tuple``/``list``/``dict`` (string keys) of those. Exact types
    only: subclasses (with their own ``__repr__``) are refused.

    Raises:
        ExportError: anything else; ``field`` is ``where``.
    """
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return repr(value)
    if kind is float:
        if not math.isfinite(value):
            raise ExportError(where, f"non-finite float {value!r} cannot be exported")
        return repr(value)
    if kind is str:
        if not _SAFE_STRING.match(value):
            raise ExportError(where, f"string {value[:80]!r} has characters outside [A-Za-z0-9_.:+-]")
        return repr(value)
    if kind is tuple:
        items = [literal(v, where=where) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if kind is list:
        return "[" + ", ".join(literal(v, where=where) for v in value) + "]"
    if kind is dict:
        parts = []
        for key, item in value.items():
            if type(key) is not str:
                raise ExportError(where, f"dict key {key!r} is not a string")
            parts.append(f"{literal(key, where=where)}: {literal(item, where=where)}")
        return "{" + ", ".join(parts) + "}"
    raise ExportError(where, f"a {kind.__name__} cannot be exported as a literal")


def docstring_literal(text: str) -> str:
    """``text`` as a triple-quoted string literal (printable ASCII, no backslash or triple quote).

    Raises:
        ExportError: ``text`` contains anything else.
    """
    if not _DOC_TEXT.match(text) or "\\" in text or '"""' in text or text.endswith('"'):
        raise ExportError("docstring", "contains characters that cannot be written into a docstring")
    return '"""' + text + '"""'


class Slot:
    """Marks a value already rendered as a literal (the docstring)."""

    def __init__(self, source: str):
        self.source = source


def _slot_source(name: str, value: Any) -> str:
    return value.source if isinstance(value, Slot) else literal(value, where=name)


def _compare_trees(template: ast.AST, rendered: ast.AST, slots: set[str]) -> None:
    if isinstance(template, ast.Name) and template.id in slots:
        ast.literal_eval(rendered)  # raises ValueError for anything but a literal
        return
    if type(template) is not type(rendered):
        raise ValueError(f"{type(rendered).__name__} where the template has {type(template).__name__}")
    for name, expected in ast.iter_fields(template):
        actual = getattr(rendered, name, None)
        if isinstance(expected, list):
            if not isinstance(actual, list) or len(actual) != len(expected):
                raise ValueError(f"{type(template).__name__}.{name} differs in length")
            for e, a in zip(expected, actual):
                if isinstance(e, ast.AST):
                    _compare_trees(e, a, slots)
                elif e != a:
                    raise ValueError(f"{type(template).__name__}.{name}: {a!r} != {e!r}")
        elif isinstance(expected, ast.AST):
            _compare_trees(expected, actual, slots)
        elif expected != actual:
            raise ValueError(f"{type(template).__name__}.{name}: {actual!r} != {expected!r}")


def fill_template(template: str, values: dict[str, Any]) -> str:
    """Substitute ``$name`` slots of ``template`` with literals of ``values`` and prove that only
    literals were added (`check_only_literals`).

    Raises:
        ExportError: a value is not a plain literal, a slot has no value, or the result differs
            from the template anywhere but at its slots.
    """
    try:
        rendered = string.Template(template).substitute({k: _slot_source(k, v) for k, v in values.items()})
    except KeyError as exc:
        raise ExportError(str(exc.args[0]), "the template has a slot without a value") from None
    check_only_literals(template, rendered, set(values))
    return rendered


def check_only_literals(template: str, rendered: str, slots: set[str]) -> None:
    """Require ``rendered`` to be ``template`` with literals at the ``$slot`` positions only.

    Raises:
        ExportError: the syntax trees differ elsewhere, or a slot holds a non-literal.
    """
    placeholders = {name: f"__attnfuzz_slot_{name}__" for name in slots}
    try:
        template_tree = ast.parse(string.Template(template).substitute(placeholders))
        rendered_tree = ast.parse(rendered)
        _compare_trees(template_tree, rendered_tree, set(placeholders.values()))
    except (SyntaxError, ValueError) as exc:
        raise ExportError("repro", f"generated code failed the literal-only check: {exc}") from None


def validated_case(config: Any) -> AttentionCase:
    """The stored case JSON validated again.

    Raises:
        ExportError: ``field`` ``case.<name>`` for the offending field.
    """
    try:
        return AttentionCase.from_json(config)
    except CaseValidationError as exc:
        name = getattr(exc, "field", None) or "config"
        raise ExportError(f"case.{name}", f"the stored case does not validate: {exc}") from None


def check_names(backend: Any, variant: Any, signature: Any) -> None:
    """Backend and variant names and the signature must have the stored forms.

    Raises:
        ExportError: ``backend``, ``variant`` or ``signature``, whichever is malformed first.
    """
    if not isinstance(backend, str) or not NAME_PATTERN.match(backend):
        raise ExportError("backend", f"{str(backend)[:80]!r} is not a backend name")
    if not isinstance(variant, str) or not NAME_PATTERN.match(variant):
        raise ExportError("variant", f"{str(variant)[:80]!r} is not a variant name")
    if signature is not None and (not isinstance(signature, str) or not SIGNATURE_PATTERN.match(signature)):
        raise ExportError("signature", f"{str(signature)[:80]!r} is not a signature like 'out:all_zero'")
