"""The launch recipes of deploy/ (issue 36, acceptance 3), checked without a cluster, Slurm or docker:

* the KubeRay manifests: every built-in resource and every pod template validated by
  ``kubernetes-validate`` (strict: a misspelt field fails; its schemas ship with it, offline), the
  ``RayCluster``/``RayJob`` bodies against KubeRay's v1 CRD schema bundled in
  ``tests/fleet/schemas/`` (strict too); a misspelt field in either fails the same check;
* the sbatch script's dry run (``ATTNFUZZ_DRY_RUN=1``, ``srun``/``scontrol``/``squeue`` stand-ins):
  the Ray head and node lines, and an ``attnfuzz fleet up`` line that the CLI parses, one worker per
  GPU of the allocation, the budget from the job's time left, the database URL on no command line;
* the two Dockerfiles parsed (``dockerfile-parse``) and checked for their stages, base images,
  pinned versions and a non-root user.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
CRD_KINDS = {("ray.io/v1", "RayCluster"): "ray.io-v1-raycluster.json", ("ray.io/v1", "RayJob"): "ray.io-v1-rayjob.json"}


def _pod_templates(kind: str, spec: dict) -> list[tuple[str, dict]]:
    """(path, template) of every core/v1 PodTemplateSpec in a RayCluster or RayJob spec."""
    cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec", {})
    prefix = "spec" if kind == "RayCluster" else "spec.rayClusterSpec"
    found = [(f"{prefix}.headGroupSpec.template", cluster["headGroupSpec"]["template"])]
    found += [(f"{prefix}.workerGroupSpecs[{i}].template", g["template"]) for i, g in enumerate(cluster.get("workerGroupSpecs", []))]
    if kind == "RayJob" and "submitterPodTemplate" in spec:
        found.append(("spec.submitterPodTemplate", spec["submitterPodTemplate"]))
    return found


def validate(doc: dict) -> list[str]:
    """The problems of one manifest document (empty: valid)."""
    import jsonschema
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    problems = []
    schema_file = CRD_KINDS.get((doc.get("apiVersion"), doc.get("kind")))
    if schema_file is None:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc.get('kind')}: {'.'.join(map(str, exc.path))}: {exc.message}")
        return problems
    schema = json.loads((SCHEMAS / schema_file).read_text())
    for error in jsonschema.Draft7Validator(schema).iter_errors(doc):
        problems.append(f"{doc['kind']}: {'.'.join(map(str, error.path))}: {error.message}")
    for path, template in _pod_templates(doc["kind"], doc["spec"]):
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
        try:
            kubernetes_validate.validate(wrapped, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']}: {path}.{'.'.join(map(str, list(exc.path)[1:]))}: {exc.message}")
    return problems


def _documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_manifests_are_valid(name: str) -> None:
    pytest.importorskip("kubernetes_validate", reason="the test extra's kubernetes-validate is not installed")
    docs = _documents(name)
    assert {d["kind"] for d in docs} & {"RayCluster", "RayJob"}, f"{name} holds no RayCluster or RayJob"
    for doc in docs:
        assert validate(doc) == [], doc["kind"]


def test_a_misspelt_field_fails_the_manifest_check() -> None:
    """The check can fail: a misspelt field of the CRD body and one of a pod template."""
    pytest.importorskip("kubernetes_validate", reason="the test extra's kubernetes-validate is not installed")
    cluster = next(d for d in _documents("raycluster.yaml") if d["kind"] == "RayCluster")
    bad_crd = copy.deepcopy(cluster)
    bad_crd["spec"]["workerGroupSpecs"][0]["replica"] = 2
    assert any("workerGroupSpecs.0" in p and "replica" in p for p in validate(bad_crd))
    bad_pod = copy.deepcopy(cluster)
    bad_pod["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert any("imagePullPolicyy" in p for p in validate(bad_pod))
    bad_type = copy.deepcopy(cluster)
    bad_type["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    assert validate(bad_type)


def test_the_rayjob_runs_the_raycluster_s_cluster_and_a_waiting_campaign() -> None:
    cluster = next(d for d in _documents("raycluster.yaml") if d["kind"] == "RayCluster")
    job = next(d for d in _documents("rayjob.yaml") if d["kind"] == "RayJob")
    assert job["spec"]["rayClusterSpec"] == cluster["spec"]
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    entry = shlex.split(job["spec"]["entrypoint"])
    assert entry[:3] == ["attnfuzz", "fleet", "up"] and "--wait" in entry
    params = _parse_fleet_up(entry[3:])
    # a Ray job's driver runs in a directory of the head's alone: the workers' must exist on every pod
    assert params["workdir"] == "/home/attnfuzz" and params["log_dir"] == "/cache"
    # the database URL from the Secret, by environment, in the pod that runs the entrypoint
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "ATTNFUZZ_FLEET_TARGET", "valueFrom": {"secretKeyRef": {"name": "attnfuzz-fleet", "key": "database-url"}}} in head["env"]
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] >= 30 + 40  # the drain (30 s) inside the preStop wait
    assert "kill -TERM" in " ".join(worker["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])


def _parse_fleet_up(args: list[str]) -> dict:
    """``attnfuzz fleet up ARGS`` parsed by the CLI itself (click raises on an unknown option)."""
    import typer

    from service.cli import fleet as fleet_cli
    from service.cli.main import app  # noqa: F401  (registers the fleet commands)

    command = typer.main.get_command(fleet_cli.fleet_app).commands["up"]
    return command.make_context("up", list(args)).params


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_sbatch_script_s_dry_run(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "scontrol", 'printf "gpu01\\ngpu02\\ngpu03\\n"')
    _stub(bin_dir, "srun", 'echo 10.0.0.1')  # only 'hostname --ip-address' is run by the dry run
    _stub(bin_dir, "squeue", 'echo 1-02:03:04')  # time left: 1 day 2 h 3 min 4 s
    secret = "pw-not-on-a-command-line"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[01-03]",
           "SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "32", "ATTNFUZZ_DRY_RUN": "1", "ATTNFUZZ_VENV": "/opt/af",
           "ATTNFUZZ_DATABASE_URL": f"postgresql://u:{secret}@db/attnfuzz", "ATTNFUZZ_FUZZ_ARGS": "--backend fa4 --heartbeat 30"}
    done = subprocess.run(["bash", str(DEPLOY / "slurm" / "attnfuzz-fleet.sbatch")], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout
    lines = [shlex.split(line) for line in done.stdout.splitlines() if line.strip()]
    starts = [line for line in lines if line[0] == "srun"]
    assert len(starts) == 3
    head, *others = starts
    assert head[head.index("-w") + 1] == "gpu01" and "/opt/af/bin/ray" in head and "--head" in head
    assert "--port=6379" in head and "--num-gpus=8" in head and "--block" in head
    assert [o[o.index("-w") + 1] for o in others] == ["gpu02", "gpu03"]
    assert all("--address=10.0.0.1:6379" in o and "--num-gpus=8" in o and "--head" not in o for o in others)
    (up,) = [line for line in lines if line[0] == "/opt/af/bin/attnfuzz"]
    assert up[1:3] == ["fleet", "up"]
    params = _parse_fleet_up(up[3:])
    assert params["address"] == "10.0.0.1:6379" and params["campaign"] == "slurm-4242"
    assert params["workers"] == 24  # 3 nodes x 8 GPUs: one worker per GPU
    assert params["device"].value == "cuda" and params["wait"] is True
    assert params["time_budget"] == 86400 + 2 * 3600 + 3 * 60 + 4 - 300
    assert params["fuzz_args"] == ["--backend", "fa4", "--heartbeat", "30"]
    assert params["target"] is None  # from $ATTNFUZZ_FLEET_TARGET when it runs, not from the line


def test_the_sbatch_script_without_a_time_limit_asks_for_a_budget(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "scontrol", 'echo gpu01')
    _stub(bin_dir, "srun", 'echo 10.0.0.1')
    _stub(bin_dir, "squeue", 'echo UNLIMITED')
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu01",
           "ATTNFUZZ_DRY_RUN": "1", "ATTNFUZZ_DATABASE_URL": "postgresql://db/x"}
    script = str(DEPLOY / "slurm" / "attnfuzz-fleet.sbatch")
    done = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "set ATTNFUZZ_BUDGET_S" in done.stderr
    done = subprocess.run(["bash", script], env={**env, "ATTNFUZZ_BUDGET_S": "3600"}, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (up,) = [shlex.split(line) for line in done.stdout.splitlines() if "fleet" in line]
    assert _parse_fleet_up(up[3:])["time_budget"] == 3600 and _parse_fleet_up(up[3:])["workers"] == 8


def test_the_sbatch_script_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n", str(DEPLOY / "slurm" / "attnfuzz-fleet.sbatch")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _dockerfile(name: str):
    parser_module = pytest.importorskip("dockerfile_parse", reason="the test extra's dockerfile-parse is not installed")
    parser = parser_module.DockerfileParser(path=str(DEPLOY / "docker" / name), cache_content=True)
    parser.content  # noqa: B018 - parses (raises on a file it cannot read)
    return parser


def test_the_gpu_worker_dockerfile() -> None:
    parser = _dockerfile("worker.Dockerfile")
    froms = [i["value"] for i in parser.structure if i["instruction"] == "FROM"]
    assert froms == ["${CUDA_IMAGE} AS base", "base AS fa2", "base AS worker"]
    args = dict(i["value"].split("=", 1) for i in parser.structure if i["instruction"] == "ARG" and "=" in i["value"])
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:13.0") and "cudnn-devel" in args["CUDA_IMAGE"]
    runs = " ".join(i["value"] for i in parser.structure if i["instruction"] == "RUN")
    for pin in ("torch==2.11.0", "flash-attn-4==4.0.0b36", "transformer-engine[pytorch]==2.20.2", "flash-attn==${FA2_VERSION}",
                "FLASH_ATTN_CUDA_ARCHS=90", "rm -rf x/flash_attn/cute", "[fleet,postgres]"):
        assert pin in runs, pin
    assert "download.pytorch.org/whl/cu130" in runs
    assert all("rm -rf /var/lib/apt/lists" in i["value"] for i in parser.structure
               if i["instruction"] == "RUN" and "apt-get install" in i["value"])
    users = [i["value"] for i in parser.structure if i["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert not any(i["instruction"] == "ADD" for i in parser.structure)


def test_the_service_dockerfile() -> None:
    parser = _dockerfile("service.Dockerfile")
    assert parser.baseimage.startswith("python:3.12")
    runs = " ".join(i["value"] for i in parser.structure if i["instruction"] == "RUN")
    assert "download.pytorch.org/whl/cpu" in runs and "[postgres]" in runs
    assert [i["value"] for i in parser.structure if i["instruction"] == "EXPOSE"] == ["8000"]
    cmd = json.loads(next(i["value"] for i in parser.structure if i["instruction"] == "CMD"))
    assert "attnfuzz serve --host 0.0.0.0 --port 8000" in cmd[-1] and "attnfuzz db upgrade" in cmd[-1]
    users = [i["value"] for i in parser.structure if i["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0")
    # the build context leaves the local venv and databases out of COPY .
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "*.db" in ignored
