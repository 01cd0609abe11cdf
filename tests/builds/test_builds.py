"""fuzzer/builds/{versions,wheels,install,envs,selection}.py: version order, wheelhouse scanning,
extras from Requires-Dist and rules, preparing and adopting build environments, build identity."""

from __future__ import annotations

import json
import zipfile

import pytest
from packaging.requirements import Requirement

from fuzzer.builds.envs import BuildEnvironment, adopt_build_dir, load_environments, prepare_from_wheelhouse
from fuzzer.builds.install import unpack_wheel
from fuzzer.builds.selection import select_builds
from fuzzer.builds.versions import (
    BuildError,
    BuildPrepareError,
    build_key,
    build_packages,
    parse_version,
)
from fuzzer.builds.wheels import (
    load_rules,
    resolve_extras,
    scan_wheelhouse,
    wheel_requirements,
    wheelhouse_versions,
)
from fuzzer.results import BuildFingerprint, version_key
from tests.builds.fakebuilds import DEP, KERNEL, write_wheel


def no_shared(name: str) -> str | None:
    """A shared stack without any package (for `resolve_extras` on explicit requirements)."""
    return None


def test_versions_order_by_pep440_with_prereleases_not_by_text():
    versions = ["4.0.0", "4.0.0b11", "4.0.0rc1", "4.0.0b9", "4.0.0b36", "4.0.0.dev1"]
    assert sorted(versions, key=version_key) == ["4.0.0.dev1", "4.0.0b9", "4.0.0b11", "4.0.0b36", "4.0.0rc1", "4.0.0"]


def test_versions_that_are_not_pep440_sort_first_and_are_refused_where_a_version_is_required():
    assert sorted(["1.0", "unknown"], key=version_key) == ["unknown", "1.0"]
    with pytest.raises(BuildError, match=r"good: 'b30' is not a PEP 440 version"):
        parse_version("b30", "good")


def test_the_wheelhouse_lists_versions_of_a_package_in_order(fake_wheelhouse):
    assert wheelhouse_versions([fake_wheelhouse], "Attnfuzz_FakeKernel") == [
        "1.0", "1.0.1", "1.1", "1.1.1", "1.1.2", "1.2rc1", "1.2", "1.3", "1.4", "2.0",
    ]
    names = {w.name for w in scan_wheelhouse([fake_wheelhouse])}
    assert names == {KERNEL, DEP}


def test_a_wheel_for_another_platform_is_ignored_and_a_bad_name_is_named(tmp_path):
    (tmp_path / "x-1.0-cp27-cp27m-win32.whl").write_bytes(b"")
    assert scan_wheelhouse([tmp_path]) == []
    (tmp_path / "not-a-wheel.whl").write_bytes(b"")
    with pytest.raises(BuildError, match="not-a-wheel.whl"):
        scan_wheelhouse([tmp_path])
    with pytest.raises(BuildError, match="wheelhouse: .* is not a directory"):
        scan_wheelhouse([tmp_path / "missing"])


def test_requires_dist_is_read_from_the_wheel_with_markers_evaluated(tmp_path):
    wheel = write_wheel(tmp_path, "pkg", "1.0", {"pkg/__init__.py": ""}, ["a>=1", 'b; extra == "dev"', 'c; python_version < "3"'])
    assert [str(r) for r in wheel_requirements(wheel)] == ["a>=1"]


def test_extras_come_from_requires_dist_only_when_the_shared_stack_does_not_satisfy_them(fake_wheelhouse):
    wheels = scan_wheelhouse([fake_wheelhouse])
    requirements = [Requirement("attnfuzz-fakedep>=2"), Requirement("torch")]
    shared = {"torch": "2.13.0", "attnfuzz-fakedep": "1.0"}.get
    (extra,) = resolve_extras(KERNEL, "2.0", requirements, wheels, shared_version=shared)
    assert (extra.name, extra.version) == (DEP, "2.0")
    assert "Requires-Dist of attnfuzz-fakekernel 2.0" in extra.reason
    assert resolve_extras(KERNEL, "2.0", requirements, wheels, shared_version={"torch": "2", DEP: "2.0"}.get) == []


def test_a_rule_adds_what_the_metadata_does_not_say_only_for_matching_versions(fake_rules, fake_wheelhouse):
    rules = load_rules(fake_rules)
    wheels = scan_wheelhouse([fake_wheelhouse])
    (extra,) = resolve_extras(KERNEL, "1.1.2", [], wheels, rules, no_shared)
    assert (extra.name, extra.version) == (DEP, "1.0") and "rule for attnfuzz-fakekernel <1.2rc1" in extra.reason
    assert resolve_extras(KERNEL, "1.2rc1", [], wheels, rules, no_shared) == []


def test_an_unresolvable_requirement_names_it_and_the_wheelhouse(fake_wheelhouse):
    wheels = scan_wheelhouse([fake_wheelhouse])
    with pytest.raises(BuildPrepareError, match=r"needs attnfuzz-fakedep>=3 .*no wheel in the wheelhouse"):
        resolve_extras(KERNEL, "2.0", [Requirement("attnfuzz-fakedep>=3")], wheels, shared_version=no_shared)
    with pytest.raises(BuildPrepareError, match="conflicts with attnfuzz-fakedep==2.0"):
        resolve_extras(
            KERNEL, "2.0", [Requirement("attnfuzz-fakedep>=2"), Requirement("attnfuzz-fakedep<2")], wheels, shared_version=no_shared
        )


def test_with_allow_missing_an_unresolvable_requires_dist_is_recorded_not_fatal(tmp_path):
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    write_wheel(wheelhouse, "needy", "1.0", {"needy/__init__.py": ""}, ["attnfuzz-nowhere>=1", "torch"])
    with pytest.raises(BuildPrepareError, match="needs attnfuzz-nowhere>=1"):
        prepare_from_wheelhouse("needy", "1.0", [wheelhouse], tmp_path / "builds")
    env = prepare_from_wheelhouse("needy", "1.0", [wheelhouse], tmp_path / "builds", allow_missing=True)
    (missing,) = env.unresolved
    assert missing.startswith("attnfuzz-nowhere>=1 (Requires-Dist of needy 1.0")
    assert load_environments(tmp_path / "builds")[0].unresolved == env.unresolved


def test_the_shipped_rules_pin_an_older_cutlass_dsl_for_old_flash_attn_4_builds():
    rules = load_rules()
    for version in ("4.0.0b11", "4.0.0b26"):
        old = [r for r in rules if r.matches("flash-attn-4", parse_version(version))]
        pins = {str(req.name): str(req.specifier) for r in old for req in r.requires}
        assert pins == {
            "nvidia-cutlass-dsl": "==4.6.0.dev0",
            "nvidia-cutlass-dsl-libs-cu13": "==4.6.0.dev0",
            "quack-kernels": "==0.5.3",
        }, version
    for version in ("4.0.0b27", "4.0.0b36"):
        assert not [r for r in rules if r.matches("flash-attn-4", parse_version(version))], version


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[[rule]]\npackage = "x"\nversions = "<<1"\nrequires = ["a"]\n', r"rule\[0\]\.versions"),
        ('[[rule]]\npackage = "x"\nrequires = []\n', r"rule\[0\]\.requires"),
        ('[[rule]]\npackage = "x"\nrequires = ["a b c"]\n', r"rule\[0\]\.requires\[0\]"),
        ('[[rule]]\npackage = "x"\nrequires = ["a"]\ncolour = 1\n', r"rule\[0\]\.colour: unknown field"),
        ("[[rule]\n", "cannot read"),
    ],
)
def test_malformed_rules_are_refused_naming_the_file_and_field(tmp_path, text, field):
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(BuildError, match=field) as info:
        load_rules(path)
    assert "rules.toml" in str(info.value)


@pytest.mark.parametrize("installer", ["unpack", "pip"])
def test_a_prepared_build_has_its_wheel_and_extras_in_its_own_site(tmp_path, fake_wheelhouse, fake_rules, installer):
    env = prepare_from_wheelhouse(
        KERNEL, "1.0", [fake_wheelhouse], tmp_path, rules=load_rules(fake_rules), installer=installer
    )
    site = tmp_path.resolve() / "attnfuzz-fakekernel-1.0" / "site"
    assert env.paths == (site,) and env.source == "wheelhouse"
    assert 'RESOLVER = "sum"' in (site / "attnfuzz_fakekernel" / "__init__.py").read_text()
    assert "API = 1" in (site / "attnfuzz_fakedep" / "__init__.py").read_text()
    assert [(e.name, e.version) for e in env.extras] == [(DEP, "1.0")]
    (loaded,) = load_environments(tmp_path, KERNEL)
    assert loaded.extras == env.extras and loaded.manifest == site.parent / "build.json"


def test_preparing_again_reuses_the_environment_unless_forced(tmp_path, fake_wheelhouse):
    first = prepare_from_wheelhouse(KERNEL, "2.0", [fake_wheelhouse], tmp_path)
    marker = first.paths[0] / "marker"
    marker.write_text("kept")
    again = prepare_from_wheelhouse(KERNEL, "2.0", [fake_wheelhouse], tmp_path)
    assert again.prepared_at == first.prepared_at and marker.exists()
    prepare_from_wheelhouse(KERNEL, "2.0", [fake_wheelhouse], tmp_path, force=True)
    assert not marker.exists()
    assert not list(tmp_path.glob("*.tmp-*")) and not list(tmp_path.glob("*.old-*"))


def test_a_version_missing_from_the_wheelhouse_names_the_versions_there(tmp_path, fake_wheelhouse):
    with pytest.raises(BuildPrepareError, match=r"no wheel of attnfuzz-fakekernel==9\.9 .*versions there: 1\.0, 1\.0\.1"):
        prepare_from_wheelhouse(KERNEL, "9.9", [fake_wheelhouse], tmp_path)


def test_an_adopted_directory_keeps_its_path_and_gets_its_extras_in_front(tmp_path, fake_wheelhouse, fake_rules):
    build_dir = tmp_path / "fa4" / "1.1"
    unpack_wheel(next(fake_wheelhouse.glob("attnfuzz_fakekernel-1.1-*.whl")), build_dir)
    env = adopt_build_dir(
        build_dir, KERNEL, tmp_path / "builds", wheelhouses=[fake_wheelhouse], rules=load_rules(fake_rules)
    )
    assert env.version == "1.1" and env.source == "build-dir"
    assert env.paths == ((tmp_path / "builds").resolve() / "attnfuzz-fakekernel-1.1" / "site", build_dir.resolve())
    assert env.pythonpath("/project", "") == f"{env.paths[0]}:{build_dir.resolve()}:/project"
    shared_has_the_old_dep = {DEP: "1.0", "torch": "2.13.0", "packaging": "26.0"}.get
    plain = adopt_build_dir(build_dir, KERNEL, None, shared_version=shared_has_the_old_dep, rules=load_rules(fake_rules))
    assert plain.paths == (build_dir.resolve(),) and plain.manifest is None


def test_an_adopted_directory_whose_extras_are_missing_is_selected_but_cannot_be_made_ready(tmp_path, fake_wheelhouse, fake_rules):
    build_dir = tmp_path / "fa4" / "1.0"
    unpack_wheel(next(fake_wheelhouse.glob("attnfuzz_fakekernel-1.0-*.whl")), build_dir)
    selection = select_builds(KERNEL, builds_dir=tmp_path / "builds", build_dirs=[build_dir], rules=load_rules(fake_rules))
    assert selection.versions == ("1.0",) and "1.0" not in selection.ready
    with pytest.raises(BuildPrepareError, match=r"needs attnfuzz-fakedep<2 \(rule for attnfuzz-fakekernel"):
        selection.environment("1.0")


def test_a_directory_without_the_package_is_refused_naming_it(tmp_path):
    with pytest.raises(BuildError, match=r"build_dir: .* holds no flash-attn-4 distribution"):
        adopt_build_dir(tmp_path, "flash-attn-4")
    with pytest.raises(BuildError, match="is not a directory"):
        adopt_build_dir(tmp_path / "nope", "flash-attn-4")


def test_a_wheel_member_outside_the_target_is_refused(tmp_path):
    wheel = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("../escape.py", "x = 1")
    with pytest.raises(BuildPrepareError, match="outside the target"):
        unpack_wheel(wheel, tmp_path / "site")
    assert not (tmp_path / "escape.py").exists()


def test_a_malformed_manifest_is_named(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "build.json").write_text(json.dumps({"schema_version": 1, "package": "p", "version": "1.0", "source": "s", "paths": []}))
    with pytest.raises(BuildError, match=r"build\.json: paths"):
        load_environments(tmp_path)


def test_a_selection_orders_versions_and_checks_the_bisection_range(tmp_path, fake_wheelhouse):
    selection = select_builds(KERNEL, builds_dir=tmp_path, wheelhouses=[fake_wheelhouse])
    assert selection.between("1.1", "1.2") == ["1.1", "1.1.1", "1.1.2", "1.2rc1", "1.2"]
    with pytest.raises(BuildError, match=r"bad: no build attnfuzz-fakekernel==3\.0"):
        selection.between("1.0", "3.0")
    with pytest.raises(BuildError, match="good: 2.0 must be older than bad: 1.0"):
        selection.between("2.0", "1.0")
    with pytest.raises(BuildError, match=r"version: no build attnfuzz-fakekernel==7"):
        select_builds(KERNEL, builds_dir=tmp_path, wheelhouses=[fake_wheelhouse], versions=["7"])


def test_build_packages_carry_the_fingerprint_lines_and_the_backends_versions():
    fingerprint = BuildFingerprint(torch="2.13.0", flash_attn_4="4.0.0b30", cudnn="91002", driver="580.65")
    packages = build_packages(fingerprint, {"Flash_Attn_4": "4.0.0b29", "nvidia-cudnn-cu13": "9.25.0", "triton": "missing"})
    assert packages == {
        "cudnn": "91002",
        "flash-attn-4": "4.0.0b30",
        "nvidia-cudnn-cu13": "9.25.0",
        "nvidia-driver": "580.65",
        "torch": "2.13.0",
    }


def test_the_build_key_hashes_every_package_and_is_the_fingerprint_for_its_lines_alone():
    fingerprint = BuildFingerprint(torch="2.13.0", flash_attn_4="4.0.0b30")
    assert build_key(fingerprint, build_packages(fingerprint, {})) == fingerprint.fingerprint_id
    assert build_key(fingerprint, build_packages(fingerprint, {"flash-attn-4": "4.0.0b29"})) == fingerprint.fingerprint_id
    one = build_key(fingerprint, build_packages(fingerprint, {KERNEL: "1.0"}))
    two = build_key(fingerprint, build_packages(fingerprint, {KERNEL: "1.1"}))
    assert len({one, two, fingerprint.fingerprint_id}) == 3 and len(one) == 16


def test_an_environment_round_trips_through_its_manifest(tmp_path):
    env = BuildEnvironment(KERNEL, "1.2rc1", (tmp_path / "a", tmp_path / "b"), "build-dir", (), None, "2026-11-29T00:00:00+00:00")
    assert BuildEnvironment.from_json(env.to_json()) == env
    with pytest.raises(BuildError, match="schema_version"):
        BuildEnvironment.from_json({**env.to_json(), "schema_version": 7}, "m.json")
