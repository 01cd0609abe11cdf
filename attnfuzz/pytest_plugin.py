"""pytest plugin: run corpus cases as tests with their recorded expectations.

Usage::

    pytest --attnfuzz-corpus corpus/                      # every corpus/**/*.json is one test
    pytest --attnfuzz-corpus corpus/ --attnfuzz-backend mypkg.backend:MyBackend

Each corpus entry (`fuzzer.builds.corpus.CorpusEntry`) becomes one test item named
``<backend>/<variant>[<case_id>]``. The item runs the entry's case on its backend variant the way
a fuzz worker does (`fuzzer.evaluate.Evaluator`: deterministic inputs, the float64 oracle,
the same comparison) and checks the entry's ``expected`` block:

* ``expected.status == "pass"``: the case must pass; a failure names its signature.
* ``expected.status == "fail"``: the case must fail with ``expected.signature``; passing (a fixed
  kernel: update the corpus) or another signature fails the test.

The test skips, with the reason, when the backend is unknown here, unavailable on this machine
(package, GPU, architecture) or declares the case unsupported. A malformed corpus file is a
collection error naming the file and field.

Options: ``--attnfuzz-corpus DIR`` (repeatable; the directories are collected in addition to the
command line's paths), ``--attnfuzz-backend MODULE:ATTR`` (extra backend plugins, repeatable),
``--attnfuzz-isolation none|process`` (``none``, the default, runs backends in the pytest process;
``process`` in attnfuzz's child processes, so a crash becomes a ``crash`` result).

The plugin is inert without ``--attnfuzz-corpus`` and imports nothing of attnfuzz until a corpus
is collected, so it cannot clash with a project's own ``service``/``fuzzer``/``oracle`` packages
while they run their own tests. It is registered through the ``pytest11`` entry point
``attnfuzz`` as the module ``attnfuzz.pytest_plugin`` (a name of its own); without that entry
point use ``-p attnfuzz.pytest_plugin``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

CORPUS_ROOTS = pytest.StashKey[list[Path]]()
WORKERS = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnfuzz", "attnfuzz corpus replay")
    group.addoption(
        "--attnfuzz-corpus", action="append", default=[], metavar="DIR",
        help="Run every corpus/**/*.json entry under DIR as a test with its recorded expectation.",
    )
    group.addoption(
        "--attnfuzz-backend", action="append", default=[], metavar="MODULE:ATTR",
        help="Extra attnfuzz backend plugin (as for 'attnfuzz fuzz --backend').",
    )
    group.addoption(
        "--attnfuzz-isolation", default="none", choices=("none", "process"),
        help="Run backends in the pytest process (none) or in child processes (process).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "attnfuzz_corpus: a test generated from an attnfuzz corpus entry")
    roots = [Path(p).resolve() for p in config.getoption("attnfuzz_corpus")]
    config.stash[CORPUS_ROOTS] = roots
    config.stash[WORKERS] = {}
    for root in roots:
        if not root.is_dir():
            raise pytest.UsageError(f"--attnfuzz-corpus {root}: not a directory")
        covered = any(root == Path(a).resolve() or root.is_relative_to(Path(a).resolve()) for a in config.args
                      if Path(a).exists())
        if not covered:
            config.args.append(str(root))


def pytest_unconfigure(config: pytest.Config) -> None:
    for worker in config.stash.get(WORKERS, {}).values():
        if hasattr(worker, "close"):  # entries that skipped hold their reason (a str) or None
            worker.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    roots = parent.config.stash.get(CORPUS_ROOTS, [])
    if file_path.suffix == ".json" and any(file_path.resolve().is_relative_to(root) for root in roots):
        return CorpusFile.from_parent(parent, path=file_path)
    return None


class CorpusFile(pytest.File):
    """One corpus JSON file: one test item."""

    def collect(self):
        from fuzzer.builds.corpus import CorpusEntry, CorpusError

        try:
            entry = CorpusEntry.from_json(json.loads(self.path.read_text()), origin=str(self.path))
        except (OSError, json.JSONDecodeError, CorpusError) as exc:
            raise self.CollectError(f"{self.path}: {exc}") from None
        yield CorpusItem.from_parent(self, name=f"{entry.backend}/{entry.variant}[{entry.case.case_id}]", entry=entry)


class CorpusMismatch(AssertionError):
    """The case did not do what the corpus entry expects."""


class CorpusItem(pytest.Item):
    """Runs one corpus entry and checks its expectation (see the module docstring)."""

    def __init__(self, *, entry: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.entry = entry
        self.add_marker(pytest.mark.attnfuzz_corpus)

    def runtest(self) -> None:
        entry = self.entry
        worker = _worker_for(self.config, entry.backend)
        backend = worker.backends[entry.backend]
        reasons = backend.unsupported_reasons(entry.case, entry.variant)
        if reasons:
            pytest.skip(f"{entry.backend}/{entry.variant} does not support this case here: {'; '.join(reasons)}")
        result = worker.evaluate(entry.case, phase="replay", tasks=[(entry.backend, entry.variant)]).results[0]
        where = f"{entry.backend}/{entry.variant} on case {entry.case.case_id} ({entry.case.describe()})"
        if result.status == "unsupported":
            pytest.skip(f"{where}: unsupported: {result.detail}")
        if entry.expected_status == "pass" and result.status != "pass":
            raise CorpusMismatch(
                f"{where}: expected pass, got {result.status} {result.signature} "
                f"(error ratio {result.error_ratio}); {result.detail}".rstrip("; ")
            )
        if entry.expected_status == "fail":
            if result.status == "pass":
                raise CorpusMismatch(
                    f"{where}: expected to fail with {entry.expected_signature}, but it passes "
                    "(fixed? update the corpus entry's expected block)"
                )
            if result.signature != entry.expected_signature:
                raise CorpusMismatch(
                    f"{where}: expected {entry.expected_signature}, got {result.status} {result.signature}"
                )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CorpusMismatch):
            return f"{self.path}: {excinfo.value}\n  why it is in the corpus: {self.entry.why}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"attnfuzz corpus {self.name}"


def _worker_for(config: pytest.Config, name: str) -> Any:
    """An open `fuzzer.evaluate.Evaluator` for backend ``name`` (one per backend, kept for the
    session); skips when the backend is unknown or unavailable."""
    from fuzzer import registry
    from fuzzer.backends.base import BackendError
    from fuzzer.evaluate import Evaluator

    workers = config.stash[WORKERS]
    if name not in workers:
        workers[name] = None
        specs = config.getoption("attnfuzz_backend")
        try:
            selected = registry.select([name], specs)
            chosen = [(b, s) for b, s in selected if b.name == name]
            backend = chosen[0][0]
            reason = backend.availability()
            if reason:
                workers[name] = f"{name} is not available here: {reason}"
            else:
                evaluator = Evaluator(chosen, device=backend.device, isolation=config.getoption("attnfuzz_isolation"))
                reason = evaluator.open().get(name)
                if reason:  # as its child process sees it
                    evaluator.close()
                    workers[name] = f"{name} is not available here: {reason}"
                else:
                    workers[name] = evaluator
        except (BackendError, ValueError) as exc:
            workers[name] = f"{name}: {exc} (an extra backend is loaded with --attnfuzz-backend MODULE:ATTR)"
    found = workers[name]
    if isinstance(found, str):
        pytest.skip(found)
    return found
