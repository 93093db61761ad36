"""`make install` on a distribution's own Python (externally managed, PEP 668): it makes .venv, installs
there and never into that Python, and every other target then runs .venv's python.

A distribution Python is simulated without root: a prefix of its own whose standard library is the running
interpreter's (linked file by file) plus an ``EXTERNALLY-MANAGED`` marker, with pip beside it, so that
``python -m pip install`` there stops with pip's ``externally-managed-environment`` error as on Debian 12.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pip_folder() -> Path:
    """pip's package folder, found in a subprocess: looking pip up here (import or find_spec) turns off
    setuptools' distutils shim in this process, and torch's compiler then fails in later tests."""
    where = "import os, pip; print(os.path.dirname(pip.__file__))"
    return Path(
        subprocess.run([sys.executable, "-c", where], capture_output=True, text=True, check=True).stdout.strip()
    )


@pytest.fixture(scope="module")
def managed_python(tmp_path_factory) -> Path:
    """bin/python3 of a fresh prefix that is not a virtual environment and whose stdlib carries EXTERNALLY-MANAGED."""
    prefix = tmp_path_factory.mktemp("distribution")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = Path(sysconfig.get_paths()["stdlib"])  # the base interpreter's, also from inside a venv
    real = Path(os.path.realpath(sys.executable))
    (prefix / "bin").mkdir()
    python = prefix / "bin" / "python3"
    shutil.copy2(real, python)  # a copy, not a link: Python finds its prefix from where its executable lies
    lib = prefix / "lib"
    (lib / version / "site-packages").mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (lib / version / entry.name).symlink_to(entry)
    for shared in stdlib.parent.glob("libpython*"):  # a --enable-shared build finds libpython beside its prefix
        (lib / shared.name).symlink_to(shared)
    (lib / version / "site-packages" / "pip").symlink_to(pip_folder())
    (lib / version / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=This Python is managed by the distribution (posbench's test).\n"
    )
    env = clean_env()
    probe = "import sys, sysconfig; print(sys.prefix == sys.base_prefix, sysconfig.get_paths()['stdlib'])"
    done = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", str(lib / version)], done.stdout  # its own prefix, not a venv
    return python


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without an active virtual environment (a fresh login shell on the distribution)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return {**env, **extra}


@pytest.fixture
def clone(tmp_path) -> Path:
    """What `make install` reads: the Makefile, pyproject.toml, README.md and the package's sources."""
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path)
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(REPO / "conf", tmp_path / "conf", symlinks=True)
    return tmp_path


def make(clone: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``make ARGS`` in ``clone`` without an active virtual environment; stdout with its spaces collapsed."""
    done = subprocess.run(["make", *args], cwd=clone, env=clean_env(**env), capture_output=True, text=True, timeout=600)
    done.stdout = " ".join(done.stdout.split())
    return done


def test_the_simulated_distribution_python_refuses_pip(managed_python, tmp_path):
    done = subprocess.run(
        [managed_python, "-m", "pip", "install", "--no-index", "--dry-run", "posbench"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "externally-managed-environment" in done.stderr, done.stderr


def test_make_plans_a_venv_on_a_managed_python(managed_python, clone):
    plan = make(clone, "-n", "install", f"PYTHON={managed_python}")
    assert plan.returncode == 0, plan.stderr
    assert f"{managed_python} -m venv .venv" in plan.stdout
    assert ".venv/bin/python -m pip install torch==2.13.0" in plan.stdout
    assert ".venv/bin/python -m pip install -e '.[test]'" in plan.stdout
    assert f"{managed_python} -m pip" not in plan.stdout
    # an active virtual environment is used as it is: no .venv
    plan = make(clone, "-n", "install", "test", "PYTHON=python3", VIRTUAL_ENV="/somewhere")
    assert "-m venv" not in plan.stdout and "python3 -m pip install -e '.[test]'" in plan.stdout
    assert "OMP_NUM_THREADS=1 python3 -m pytest -q -n auto" in plan.stdout


@pytest.mark.slow
def test_make_install_on_a_managed_python_installs_into_dot_venv(managed_python, clone):
    """A real `make install` (pip resolving without installing, to stay within a minute), then the targets."""
    done = make(clone, "install", f"PYTHON={managed_python}", "PIP_ARGS=--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    venv = clone / ".venv"
    assert (venv / "pyvenv.cfg").is_file() and "Would install" in done.stdout
    cfg = (venv / "pyvenv.cfg").read_text()
    assert f"home = {managed_python.parent}" in cfg  # made from the distribution's python, by plain venv
    assert not list((managed_python.parents[1] / "lib").glob("python3*/site-packages/torch*"))
    for target, command in [("test", "-m pytest -q"), ("lint", "-m ruff check"), ("quick", "-m posbench -m train")]:
        plan = make(clone, "-n", target, f"PYTHON={managed_python}")
        assert f".venv/bin/python {command}" in plan.stdout, (target, plan.stdout)
