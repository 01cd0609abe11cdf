"""Acceptance (issue 16): for every signature class, the exported repro of a stored failure runs
under plain pytest in a fresh virtual environment without attnfuzz, fails against the planted
kernel and passes against the fixed one; once for a built-in backend (PyTorch SDPA on the CPU)
and once for the README's example plugin installed by entry point (``mykernel``), exported with
plain ``attnfuzz export``.

The kernels: ``mykernel`` (written below into a temporary directory) is a small float32 attention
library whose module-level ``BUG`` plants one bug; ``mykernel.patch_torch(bug)`` plants the same
bugs into ``torch.nn.functional.scaled_dot_product_attention`` and the CPU flash op
(``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``) for the built-in backends.

=================  =============================================  ======================
bug                what                                           signature
=================  =============================================  ======================
``all_zero``       out * 0                                        ``out:all_zero``
``nan``            one NaN in out                                 ``out:nan``
``softmax_scale``  softmax_scale * 1.05                           ``out:mismatch``
``drop_last_key``  the last key dropped when seqlen_k % 64 != 0   ``out:tile_mismatch``
``lse_log2``       lse in log2                                    ``lse:mismatch``
``dk_scale``       dk * 1.1                                       ``dk:mismatch``
=================  =============================================  ======================

The path is the real one: the worker runs the planted backend and stores the failure with its
allowances in SQL; the built-ins are exported by ``GET /api/cases/{id}/repro.py``, the plugin by
the ``attnfuzz export`` command (one run as a subprocess with the entry point on ``PYTHONPATH``,
no wrapper). All files then run in one pytest invocation per kernel build (planted, fixed) in
the fresh environment (``torch==2.13.0`` and ``pytest`` only, created once per session).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from service.db import migrations
from service.api.app import create_app
from service.db.engine import make_engine
from service.settings import Settings
from service.db.store import SqlStore

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CASE = AttentionCase(batch_size=2, seqlen_q=70, seqlen_k=67, num_heads=2, head_dim=16, dtype="bfloat16",
                     causal=True, causal_alignment="top_left")
BUGS = {
    "all_zero": "out:all_zero",
    "nan": "out:nan",
    "softmax_scale": "out:mismatch",
    "drop_last_key": "out:tile_mismatch",
    "lse_log2": "lse:mismatch",
    "dk_scale": "dk:mismatch",
}
# built-in backend variant per bug: lse comes only from the CPU flash op
BUILTIN = {bug: ("torch-cpu-flash", "aten_lse") if bug == "lse_log2" else ("torch-cpu-math", "is_causal") for bug in BUGS}

MYKERNEL = '''
"""mykernel: attention(q, k, v, *, causal, softmax_scale) on [batch, seqlen, heads, dim] tensors
(top-left causal), float32 math, returns (out in q's dtype, lse float32 [batch, heads, seqlen_q]).
BUG plants one bug; patch_torch(bug) plants it into PyTorch's SDPA and CPU flash op."""
import math

import torch

BUG = None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _inputs(bug, k, v, scale, seq_dim):
    if bug == "softmax_scale":
        scale = scale * 1.05
    if bug == "dk_scale":
        k = _ScaleGrad.apply(k, 1.1)
    if bug == "drop_last_key" and k.shape[seq_dim] % 64:
        k, v = k.narrow(seq_dim, 0, k.shape[seq_dim] - 1), v.narrow(seq_dim, 0, v.shape[seq_dim] - 1)
    return k, v, scale


def _outputs(bug, out, lse):
    if bug == "all_zero":
        out = out * 0
    elif bug == "nan":
        mask = torch.zeros(out.shape, dtype=torch.bool, device=out.device)
        mask.view(-1)[7] = True
        out = torch.where(mask, torch.full_like(out, math.nan), out)
    elif bug == "lse_log2" and lse is not None:
        lse = lse / math.log(2.0)
    return out, lse


def attention(q, k, v, *, causal=False, softmax_scale=None):
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    k, v, scale = _inputs(BUG, k, v, scale, 1)
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    scores = qf @ kf.transpose(-1, -2) * scale
    if causal:
        visible = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = (torch.softmax(scores, dim=-1) @ vf).transpose(1, 2).to(q.dtype)
    return _outputs(BUG, out, lse)


def patch_torch(bug):
    """Plant ``bug`` into torch's SDPA and CPU flash op; returns a function that undoes it."""
    functional, real_sdpa, real_aten = torch.nn.functional, torch.nn.functional.scaled_dot_product_attention, torch.ops.aten

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        k, v, scale = _inputs(bug, k, v, q.shape[-1] ** -0.5 if scale is None else scale, 2)
        if attn_mask is not None and attn_mask.shape[-1] != k.shape[2]:
            attn_mask = attn_mask[..., : k.shape[2]]
        out = real_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        return _outputs(bug, out, None)[0]

    def flash_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
        k, v, scale = _inputs(bug, k, v, q.shape[-1] ** -0.5 if scale is None else scale, 2)
        out, lse = real_aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        return _outputs(bug, out, lse)

    class Aten:
        def __getattr__(self, name):
            return getattr(real_aten, name)

    aten = Aten()
    aten._scaled_dot_product_flash_attention_for_cpu = flash_for_cpu
    functional.scaled_dot_product_attention = sdpa
    torch.ops.aten = aten

    def undo():
        functional.scaled_dot_product_attention = real_sdpa
        torch.ops.aten = real_aten

    return undo
'''

CONFTEST = '''
import pytest

import mykernel


@pytest.fixture(autouse=True)
def planted_kernel():
    """This directory's planted build: {bug!r} in {where}."""
    if {builtin!r}:
        undo = mykernel.patch_torch({bug!r})
        yield
        undo()
    else:
        mykernel.BUG = {bug!r}
        yield
        mykernel.BUG = None
'''


def readme_plugin() -> str:
    """The README's example plugin module, verbatim (the first python block of its Plugins section)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Plugins"):]
    return re.search(r"```python\n(.+?)\n```", section, re.S).group(1) + "\n"


def _distribution_closure(*names: str) -> list:
    """The installed distributions ``names`` need (their requirements, recursively, markers
    evaluated without extras): `importlib.metadata.Distribution`s of this environment."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, object] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if canonicalize_name(name) in found:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        found[canonicalize_name(name)] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment that sees only torch, pytest and what they require (this
    environment's installed files, linked: torch==2.13.0 is the one the README installs), not
    attnfuzz nor any other test dependency. Linking instead of ``pip install`` saves the ~45 s
    copy of torch; what the venv can import is the same."""
    root = tmp_path_factory.mktemp("venv")
    venv = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    linked = root / "linked"
    linked.mkdir()
    for dist in _distribution_closure("torch", "pytest"):
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith((".", "/"))}
        for top in tops:
            source = base / top
            if source.exists() and not (linked / top).exists() and top not in ("bin", "share", "include"):
                (linked / top).symlink_to(source)
    (site / "linked-torch-pytest.pth").write_text(f"{linked}\n")
    check = subprocess.run([str(python), "-c", "import torch, pytest; print(torch.__version__)"],
                           capture_output=True, text=True, timeout=300, env={"PATH": os.environ["PATH"]})
    assert check.returncode == 0 and check.stdout.startswith("2.13.0"), check.stdout + check.stderr
    return python


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``lib``: the planted library ``mykernel``; ``plugin``: the README plugin with its entry
    point (a ``.dist-info`` as ``pip install`` writes it), both directories for ``sys.path``."""
    root = tmp_path_factory.mktemp("kernels")
    lib = root / "lib" / "mykernel"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(MYKERNEL)
    plugin = root / "plugin"
    info = plugin / "mykernel_attnfuzz-1.0.dist-info"
    info.mkdir(parents=True)
    (plugin / "mykernel_attnfuzz.py").write_text(readme_plugin())
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mykernel-attnfuzz\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[attnfuzz.backends]\nmykernel = mykernel_attnfuzz:MyKernelBackend\n")
    return {"lib": lib.parent, "plugin": plugin}


def _case(bug: str, offset: int) -> AttentionCase:
    return CASE.replace(seed=offset + list(BUGS).index(bug))


@pytest.fixture(scope="module")
def stored(kernels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database where a worker stored every planted failure (built-in and plugin)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.syspath_prepend(str(kernels["lib"]))
    monkeypatch.syspath_prepend(str(kernels["plugin"]))
    import mykernel
    from fuzzer.registry import discover

    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'attnfuzz.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        known = discover(opt_in=True)
        assert known["mykernel"][1] == "mykernel_attnfuzz:MyKernelBackend", "the entry point is found"
        backends = [known[name] for name in ("mykernel", "torch-cpu-math", "torch-cpu-flash")]
        config = WorkerConfig(backends=backends, isolation="none", shrink=False, replay_known=False, time_budget_s=None)
        with Worker(config, SqlStore(engine)) as worker:
            for bug, signature in BUGS.items():
                mykernel.BUG = bug
                try:
                    (plugin,) = worker.evaluate(_case(bug, 0), tasks=[("mykernel", "default")])
                finally:
                    mykernel.BUG = None
                undo = mykernel.patch_torch(bug)
                try:
                    (builtin,) = worker.evaluate(_case(bug, 100), tasks=[BUILTIN[bug]])
                finally:
                    undo()
                for result in (plugin, builtin):
                    assert (result.backend, result.status, result.signature) == (result.backend, "fail", signature), (
                        bug, result.signatures, result.detail)
    finally:
        engine.dispose()
        monkeypatch.undo()
    return url


def _write_pair(root: Path, name: str, source: str, bug: str, builtin: bool, filename: str) -> None:
    for build in ("planted", "fixed"):
        directory = root / build / name
        directory.mkdir(parents=True)
        (directory / filename).write_text(source)
        if build == "planted":
            where = "torch (SDPA, CPU flash op)" if builtin else "mykernel"
            (directory / "conftest.py").write_text(CONFTEST.format(bug=bug, builtin=builtin, where=where))


@pytest.fixture(scope="module")
def exported(stored: str, kernels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every stored failure exported: built-ins through the endpoint, the plugin through
    ``attnfuzz export`` (in a subprocess for one bug, in-process for the others)."""
    from service.cli.main import app

    root = tmp_path_factory.mktemp("repros")
    with TestClient(create_app(Settings(database_url=stored))) as client:
        for bug in BUGS:
            response = client.get(f"/api/cases/{_case(bug, 100).case_id}/repro.py")
            assert response.status_code == 200, response.text
            filename = re.search(r'filename="([^"]+)"', response.headers["content-disposition"]).group(1)
            _write_pair(root, f"builtin_{bug}", response.text, bug, True, filename)
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}, "PYTHONPATH": str(kernels["plugin"])}
    attnfuzz = Path(sys.executable).parent / "attnfuzz"
    for bug in BUGS:
        case_id = _case(bug, 0).case_id
        target = root / f"plugin_{bug}.py"
        if bug == "drop_last_key":  # the command as a user types it, no wrapper
            run = subprocess.run([str(attnfuzz), "export", case_id, "--db", stored, "-o", str(target)],
                                 capture_output=True, text=True, timeout=300, env=env, cwd=root)
            assert run.returncode == 0, run.stdout + run.stderr
        else:
            monkeypatch = pytest.MonkeyPatch()
            monkeypatch.syspath_prepend(str(kernels["plugin"]))
            try:
                result = CliRunner().invoke(app, ["export", case_id, "--db", stored, "-o", str(target)])
            finally:
                monkeypatch.undo()
            assert result.exit_code == 0, result.output
        source = target.read_text()
        target.unlink()
        assert f"SIGNATURE = {BUGS[bug]!r}" in source and "BACKEND = 'mykernel'" in source
        _write_pair(root, f"plugin_{bug}", source, bug, False, f"test_attnfuzz_mykernel_{bug}.py")
    return root


def _pytest_in(python: Path, directory: Path, library: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(library)
    return subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", "-W",
         "ignore::UserWarning", str(directory)],
        cwd=directory, env=env, capture_output=True, text=True, timeout=600,
    )


def test_every_exported_repro_fails_on_its_planted_kernel_and_passes_on_the_fixed_one(
    fresh_venv: Path, exported: Path, kernels: dict[str, Path]
) -> None:
    no_attnfuzz = subprocess.run([str(fresh_venv), "-c", "import oracle"], capture_output=True, text=True,
                                 cwd=exported, env={"PATH": os.environ["PATH"]})
    assert no_attnfuzz.returncode != 0, "the fresh environment must not see attnfuzz"
    count = 2 * len(BUGS)
    planted = _pytest_in(fresh_venv, exported / "planted", kernels["lib"])
    assert f"{count} failed" in planted.stdout, planted.stdout[-6000:] + planted.stderr[-2000:]
    for bug, signature in BUGS.items():
        for backend, variant in (BUILTIN[bug], ("mykernel", "default")):
            line = f"attnfuzz {backend}/{variant}: "
            hits = [chunk for chunk in planted.stdout.split(line)[1:] if f"(recorded signature {signature}," in chunk[:400]]
            assert hits, f"{backend}/{variant} {bug}: no failure naming {signature}\n" + planted.stdout[-4000:]
    assert "worst tile batch" in planted.stdout and "allowed" in planted.stdout
    fixed = _pytest_in(fresh_venv, exported / "fixed", kernels["lib"])
    assert fixed.returncode == 0 and f"{count} passed" in fixed.stdout, fixed.stdout[-6000:] + fixed.stderr[-2000:]


def test_a_plugin_named_with_module_attr_exports_the_same_file(stored: str, kernels: dict[str, Path],
                                                                tmp_path: Path, monkeypatch) -> None:
    """Without the entry point, ``--backend module:attr`` names the plugin; the file is the same."""
    from service.cli.main import app

    case_id = _case("nan", 0).case_id
    monkeypatch.syspath_prepend(str(kernels["plugin"]))
    by_entry_point = CliRunner().invoke(app, ["export", case_id, "--db", stored, "-o", "-"])
    assert by_entry_point.exit_code == 0, by_entry_point.output
    plugin_only = tmp_path / "plugin_only"
    plugin_only.mkdir()
    (plugin_only / "attnfuzz_mykernel_plugin.py").write_text(readme_plugin())
    monkeypatch.syspath_prepend(str(plugin_only))
    by_spec = CliRunner().invoke(app, ["export", case_id, "--db", stored, "-o", "-",
                                       "--backend", "attnfuzz_mykernel_plugin:MyKernelBackend"])
    assert by_spec.exit_code == 0, by_spec.output
    assert by_spec.stdout == by_entry_point.stdout
    assert "MYKERNEL_KWARGS = {'causal': True" in by_spec.stdout
