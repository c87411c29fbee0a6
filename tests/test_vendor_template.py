"""A vendor's view (issue 38): omni-backends built as wheel + sdist with a pinnable version, and the CI template
for a vendor repository (``ci/vendor/``) run step by step against the example driver installed as its own
distribution from a directory outside this repository.

The template's steps run in a private virtual environment: omni-backends and the example driver are
``pip install``-ed into it from the wheel built here and from a copy of ``tests/example_driver`` (with no
index: nothing is downloaded), while the heavy stack (torch, vLLM, pytest) is the running environment's,
seen through a ``.pth`` file over a directory of links that leaves out this repository's own installs. So
what runs is what a vendor's CI installs, not this checkout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "ci" / "vendor"
#: what the private environment must not see of the running one: this repository's installs
OWN_INSTALLS = ("omni_backends", "__editable__", "omni_simdev", "core", "_omni_backends")


def _tracked_copy(src: Path, dst: Path) -> Path:
    """The files git tracks under ``src``, copied to ``dst`` (a build never writes into the checkout)."""
    files = subprocess.run(["git", "-C", str(src), "ls-files", "-z"], capture_output=True, text=True, check=True)
    for rel in filter(None, files.stdout.split("\0")):
        if (src / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)
    return dst


def _version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Path:
    """``omni_backends-<version>-py3-none-any.whl`` and ``omni_backends-<version>.tar.gz``, built from the
    tracked files with setuptools' PEP 517 hooks (what ``python -m build`` calls)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout of omni-backends (the build copies the tracked files)")
    tmp = tmp_path_factory.mktemp("build")
    src = _tracked_copy(ROOT, tmp / "src")
    out = tmp / "dist"
    out.mkdir()
    for hook in ("build_wheel", "build_sdist"):  # one process each, as a PEP 517 frontend calls them
        proc = subprocess.run([sys.executable, "-c", f"import sys; from setuptools import build_meta; "
                               f"print(build_meta.{hook}(sys.argv[1]))", str(out)],
                              cwd=src, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_wheel_and_sdist_carry_a_pinnable_version_and_the_kit(dists):
    version = _version()
    wheel, sdist = dists / f"omni_backends-{version}-py3-none-any.whl", dists / f"omni_backends-{version}.tar.gz"
    assert wheel.exists() and sdist.exists(), sorted(p.name for p in dists.iterdir())
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("omni_backends/testing/plugin.py", "omni_backends/testing/suite/test_graphs.py",
                   "omni_backends/testing/engine_check.py", "core/cli.py"):
        assert needed in names, needed
    entry_points = zipfile.ZipFile(wheel).read(f"omni_backends-{version}.dist-info/entry_points.txt").decode()
    assert "[pytest11]" in entry_points and "omni_backends = omni_backends.testing.plugin" in entry_points
    assert not any(n.startswith("tests/") for n in names), "the wheel ships this repository's tests"


def _job_steps(name: str) -> list[str]:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((TEMPLATES / name).read_text())
    if "jobs" in doc:
        (job,) = doc["jobs"].values()
        return [s["run"] for s in job["steps"] if "run" in s]
    (job,) = [v for k, v in doc.items() if isinstance(v, dict) and "script" in v]
    return list(job["script"])


def _commands(steps: list[str]) -> list[str]:
    """Each shell command of ``steps``, continuation lines joined and blanks collapsed."""
    out = []
    for step in steps:
        for line in step.replace("\\\n", " ").splitlines():
            if line.strip():
                out.append(" ".join(line.split()))
    return out


def test_each_template_runs_both_tiers_and_check_drift_on_the_vendor_release():
    gha = _commands(_job_steps("github-actions.yml"))
    assert gha == _commands(_job_steps("gitlab-ci.yml")), "the GitLab template's commands differ from GitHub's"
    joined = "\n".join(gha)
    for needed in ('python -m pip install "$OMNI_BACKENDS"', "python -m pip install .",
                   '--device "$DRIVER" -m device_tier', '--device "$DRIVER" -m engine_tier',
                   'omni-backends check-drift --driver "$DRIVER" --source "$VENDOR_RELEASE"'):
        assert needed in joined, needed
    assert "-e ." not in joined and " tests" not in joined, "a step assumes the checkout is omni-backends"


def _private_env(tmp: Path) -> Path:
    """A venv whose site-packages sees the running environment's packages (pip and setuptools included) minus
    :data:`OWN_INSTALLS`."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=300)
    shared = Path(sysconfig.get_paths()["purelib"])
    farm = tmp / "shared-stack"
    farm.mkdir()
    for entry in shared.iterdir():
        if not entry.name.startswith(OWN_INSTALLS) and not entry.name.endswith(".pth"):
            (farm / entry.name).symlink_to(entry)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "zz_shared_stack.pth").write_text(f"{farm}\n")
    return venv


@pytest.mark.slow
def test_the_template_steps_pass_from_a_vendor_repository(dists, tmp_path):
    """The GitHub template's ``run:`` steps, in order, in a copy of the example driver outside this repository:
    the pinned kit (the wheel built here) and the driver are installed into a private environment, then the
    device tier, the engine tier and ``check-drift --source <vLLM release wheel>`` run from there."""
    release = os.environ.get("OMNI_VLLM033_SRC")
    if not release or not Path(release).exists():
        if os.environ.get("OMNI_BACKENDS_REQUIRE_VENDOR_SOURCES"):
            pytest.fail(f"OMNI_VLLM033_SRC={release!r} is not there: run scripts/fetch-vendor-sources.sh")
        pytest.skip("the vLLM 0.33.0 wheel is not fetched (scripts/fetch-vendor-sources.sh; scripts/test.sh does it)")
    version = _version()
    wheel = dists / f"omni_backends-{version}-py3-none-any.whl"
    repo = tmp_path / "omni-backends-simdev"
    shutil.copytree(ROOT / "tests" / "example_driver", repo, ignore=shutil.ignore_patterns("broken", "*.egg-info",
                                                                                        "build", "__pycache__"))
    venv = _private_env(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OMNI_BACKENDS_SELECTION", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
        DRIVER="simdev", OMNI_BACKENDS=f"omni-backends[test] @ {wheel.as_uri()}", VENDOR_RELEASE=release,
        PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", XDG_CACHE_HOME=str(tmp_path / "cache"),
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    # no index here: the driver's build backend (setuptools) is taken from the environment, not downloaded
    env["PIP_NO_BUILD_ISOLATION"] = "0"
    log = []
    for step in _job_steps("github-actions.yml"):
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=1200)
        log.append(f"$ {step}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        assert proc.returncode == 0, "\n".join(log)
    # what ran is the installed wheel and the driver's own distribution, not this checkout
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import omni_backends, omni_simdev; print(omni_backends.__file__); print(omni_simdev.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(str(venv) in p for p in where), where
    device = json.loads((repo / "reports" / "kit-device.json").read_text())
    engine = json.loads((repo / "reports" / "kit-engine.json").read_text())
    for doc in (device, engine):
        assert doc["kit"]["version"] == version and doc["kit"]["interface_version"] == 1
        assert doc["kit"]["source_url"] == wheel.as_uri(), doc["kit"]
        assert doc["kit"]["archive_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest(), doc["kit"]
        assert doc["driver"]["distribution"] == "omni-backends-simdev"
        assert doc["summary"].get("failed", 0) == 0 and doc["summary"].get("error", 0) == 0
    assert device["summary"]["passed"] >= 40
    assert engine["summary"].get("passed", 0) >= 2, engine["summary"]
