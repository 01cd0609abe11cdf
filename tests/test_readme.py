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


def test_the_readme_gpu_commands_are_the_ones_the_gpu_harness_runs():
    import tomllib

    blocks = re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())
    campaign = next(b for b in blocks if "attnfuzz fuzz --device cuda" in b)
    gpu_tests = next(b for b in blocks if "pytest -m gpu" in b)
    files = ROOT / "benchmarks" / "gpu" / "campaigns"
    fuzz = next(s for s in tomllib.loads((files / "default.toml").read_text())["steps"] if s["name"] == "fuzz")
    tests = tomllib.loads((files / "gpu-tests.toml").read_text())["steps"][0]
    assert fuzz["run"].startswith(campaign + " ")  # the harness adds only --db and --json
    assert tests["run"].startswith(gpu_tests.replace("python -m", "python3 -m", 1) + " ")
