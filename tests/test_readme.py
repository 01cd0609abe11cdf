"""The README's two commands are the ones CI and users run."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_ci_runs_the_readme_test_command_verbatim():
    commands = _readme_commands()
    test_command = next(c for c in commands if "pytest" in c)
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


def test_the_readme_run_command_fuzzes_on_the_embedded_default():
    run_command = next(c for c in _readme_commands() if "attnfuzz fuzz" in c)
    assert "torch==2.13.0" in run_command and "--time-budget" in run_command
    assert "--db" not in run_command  # the embedded default: sqlite:///attnfuzz.db
