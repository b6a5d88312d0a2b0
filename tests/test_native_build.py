"""The compiled build (setup.py, `make native`): the simulator's hot modules compiled with mypyc.

`make test` runs the engine, placement and policy tests a second time on that build with
HEADWAY_EXPECT_NATIVE=1, so those runs must really load the compiled modules; and a machine with no C
compiler must still get a working install of plain Python."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from headway._native import NATIVE_MODULES, build_name, compiled_modules

REPO = Path(__file__).resolve().parent.parent
EXPECT_NATIVE = os.environ.get("HEADWAY_EXPECT_NATIVE") == "1"


def test_the_compiled_build_run_loads_every_compiled_module() -> None:
    if not EXPECT_NATIVE:
        pytest.skip("checked in the compiled-build run of `make test` (HEADWAY_EXPECT_NATIVE=1)")
    assert compiled_modules() == list(NATIVE_MODULES)
    assert build_name() == "native"


def test_the_editable_install_runs_the_sources_as_written() -> None:
    """An edit to engine.py must take effect in `make test`'s main run: no compiled copy shadows it."""
    if EXPECT_NATIVE:
        pytest.skip("the compiled-build run loads the compiled copy on purpose")
    import headway.sim.engine as engine

    assert engine.__file__ == str(REPO / "src" / "headway" / "sim" / "engine.py")
    assert compiled_modules() == []


def _copy_of_the_repo(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".venv", "build", ".git", "*.egg-info", "*.duckdb", ".mypy_cache")
    shutil.copytree(REPO, src, ignore=skip)
    return src


@pytest.mark.parametrize(
    ("argv", "compiles"),
    [
        (["egg_info"], False),
        (["dist_info", "--output-dir", "meta"], False),
        (["-q", "sdist", "-d", "dist"], False),
        (["editable_wheel", "--dist-info-dir", "x"], False),
        (["bdist_wheel", "--dist-dir", "dist"], True),
        (["-v", "build_ext", "--inplace"], True),
    ],
)
def test_only_the_steps_of_a_build_that_compile_run_mypyc(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], compiles: bool
) -> None:
    """pip runs setup.py for the requirements and the metadata before the wheel, and an editable install
    or an sdist compiles nothing at all: mypyc there was a full mypy run and C written under build/
    (three runs for one `pip install .`)."""
    ns = runpy.run_path(str(REPO / "setup.py"), run_name="headway_setup")
    calls: list[list[str]] = []

    from setuptools import Extension

    def mypycify(paths: list[str], **kw: object) -> list[Extension]:
        calls.append(paths)
        return [Extension("headway_native__mypyc", ["x.c"], extra_compile_args=["-O3"])]

    monkeypatch.setitem(sys.modules, "mypyc.build", types.SimpleNamespace(mypycify=mypycify))
    monkeypatch.setattr(sys, "argv", ["setup.py", *argv])
    monkeypatch.delenv("HEADWAY_PURE", raising=False)
    exts = ns["native_extensions"]()
    assert len(exts) == len(calls) == compiles
    if compiles:  # each operation rounded as numpy rounds it: no fused multiply-add
        assert exts[0].extra_compile_args == ["-O3", "-ffp-contract=off"]


def test_a_simulator_mypyc_refuses_installs_plain_python_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """mypyc exits (SystemExit(1)) after printing mypy's errors: the note said 'refused the simulator (1)'."""
    ns = runpy.run_path(str(REPO / "setup.py"), run_name="headway_setup")

    def mypycify(paths: list[str], **kw: object) -> list[str]:
        raise SystemExit(1)

    monkeypatch.setitem(sys.modules, "mypyc.build", types.SimpleNamespace(mypycify=mypycify))
    monkeypatch.setattr(sys, "argv", ["setup.py", "bdist_wheel"])
    monkeypatch.delenv("HEADWAY_PURE", raising=False)
    assert ns["native_extensions"]() == []
    err = capsys.readouterr().err
    assert "mypyc refused the simulator (mypy reported the errors above); installing plain Python" in err


@pytest.mark.slow
def test_a_wheel_built_for_a_fresh_environment_compiles_the_simulator(tmp_path: Path) -> None:
    """`pip install .` into a new venv builds the wheel before numpy is installed there: the isolated
    build environment must bring numpy's annotations itself, or mypyc cannot type the simulator's arrays,
    refuses it, and the user silently gets plain Python."""
    if EXPECT_NATIVE:
        pytest.skip("run once, in the main run")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler here")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    assert subprocess.run([py, "-c", "import numpy"], capture_output=True, check=False).returncode != 0
    src = _copy_of_the_repo(tmp_path)
    out = subprocess.run(
        [py, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), "."],
        cwd=src,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "installing plain Python" not in out.stdout + out.stderr, out.stdout[-3000:]
    (wheel,) = tmp_path.glob("headway-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for mod in NATIVE_MODULES:
        stem = mod.replace(".", "/")
        assert [n for n in names if n.startswith(stem + ".") and n.endswith(".so")], (mod, names)


def _wheel(src: Path, out: Path, env: dict[str, str]) -> tuple[Path, str]:
    """`pip wheel` of the copy at `src` into `out`: the wheel, and what pip -v printed."""
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), "."],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = out.glob("headway-*.whl")
    return wheel, res.stdout + res.stderr


@pytest.mark.slow
def test_a_build_with_no_working_c_compiler_installs_plain_python(tmp_path: Path) -> None:
    if EXPECT_NATIVE:
        pytest.skip("run once, in the main run")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler here: the failing-compiler case is the machine itself")
    src = _copy_of_the_repo(tmp_path)
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}  # every compile and link fails
    wheel, said = _wheel(src, tmp_path, env)
    assert "no working C compiler" in said  # pip -v shows the build's output
    assert wheel.name.endswith("-py3-none-any.whl")  # tagged as what it is: plain Python
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")], names
    assert "headway/sim/engine.py" in names


@pytest.mark.slow
def test_a_second_build_in_the_same_checkout_ships_only_what_the_sources_hold_now(tmp_path: Path) -> None:
    """pip builds in the checkout and setuptools keeps build/lib between builds: a module deleted since
    the last build, or that build's compiled modules, must not reach the next wheel."""
    if EXPECT_NATIVE:
        pytest.skip("run once, in the main run")
    src = _copy_of_the_repo(tmp_path)
    env = {**os.environ, "HEADWAY_PURE": "1"}  # plain Python: the stale files below are the only .so

    def wheel(out: Path) -> list[str]:
        return zipfile.ZipFile(_wheel(src, out, env)[0]).namelist()

    gone = src / "src" / "headway" / "gone_since.py"
    gone.write_text("X = 1\n")
    assert "headway/gone_since.py" in wheel(tmp_path / "first")
    gone.unlink()
    lib = src / "build" / "lib"
    (lib / "headway_native__mypyc.cpython-311-x86_64-linux-gnu.so").write_bytes(b"old")
    (lib / "headway" / "sim" / "engine.cpython-311-x86_64-linux-gnu.so").write_bytes(b"old")
    names = wheel(tmp_path / "second")
    assert "headway/gone_since.py" not in names
    assert not [n for n in names if n.endswith(".so")], names
    assert "headway/sim/engine.py" in names
