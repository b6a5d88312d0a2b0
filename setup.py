"""Compile the simulator's hot modules with mypyc when building a wheel (`pip install .`).

The metadata lives in pyproject.toml. An editable install stays plain Python (a compiled module would
shadow edits to its source), and so does any build where HEADWAY_PURE=1 or compiling fails (no C
compiler or no Python headers): the same code then runs, only slower.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class OptionalBuildExt(build_ext):
    """Build the compiled modules, or none of them: a half-built set would fail at import."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # any compiler failure means: ship plain Python
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            self.extensions: list[Any] = []
            print(f"headway: compiling the simulator failed ({e}); installing plain Python", file=sys.stderr)

    def get_outputs(self) -> list[str]:
        return [o for o in super().get_outputs() if Path(o).exists()]


class CleanBuildPy(build_py):
    """Start each build from an empty build/lib: pip builds in the checkout, and setuptools' build/lib
    keeps what earlier builds put there, which the next wheel shipped (a module deleted since, or an
    earlier build's compiled modules in a plain-Python wheel)."""

    def run(self) -> None:
        lib = Path(self.build_lib)
        shutil.rmtree(lib / "headway", ignore_errors=True)
        for stale in lib.glob("headway_native__mypyc*"):
            stale.unlink()
        super().run()


# setuptools runs this file once per step of a build (pip: requirements, metadata, then the wheel). These
# steps build no extension, so mypyc (a full mypy run, C files written under build/) would only cost time:
# three runs for one `pip install .`, two for an editable install, which then compiles nothing.
NO_EXTENSIONS = frozenset({"egg_info", "dist_info", "sdist", "editable_wheel"})


def _command() -> str | None:
    """The setup command (setuptools' backend may put global options before it)."""
    return next((a for a in sys.argv[1:] if not a.startswith("-")), None)


def _compiler_error() -> str | None:
    """Why this machine cannot build a Python extension (None: it can). Asked before mypyc runs, so a
    machine without a C compiler or Python's headers gets a plain-Python wheel, tagged as one
    (py3-none-any), rather than a platform-tagged wheel with nothing compiled in it."""
    import sysconfig
    import tempfile
    from distutils.ccompiler import new_compiler  # setuptools' own copy (imported above)
    from distutils.sysconfig import customize_compiler

    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text("#include <Python.h>\nint headway_probe(void) { return 0; }\n")
        cc = new_compiler()
        customize_compiler(cc)  # CC, CFLAGS, LDSHARED as a real build would take them
        try:
            objs = cc.compile([str(probe)], output_dir=tmp, include_dirs=[sysconfig.get_paths()["include"]])
            cc.link_shared_object(objs, str(Path(tmp) / "probe.so"))
        except Exception as e:  # CompileError, LinkError, a missing program
            return f"{type(e).__name__}: {e}"
    return None


def native_extensions() -> list[Any]:
    if os.environ.get("HEADWAY_PURE") == "1" or "editable_wheel" in sys.argv or _command() in NO_EXTENSIONS:
        return []
    why_not = _compiler_error()
    if why_not is not None:
        print(f"headway: no working C compiler ({why_not}); installing plain Python", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("headway: mypyc not found; installing plain Python", file=sys.stderr)
        return []
    names = runpy.run_path(str(HERE / "src" / "headway" / "_native.py"))["NATIVE_MODULES"]
    paths = ["src/" + n.replace(".", "/") + ".py" for n in names]
    try:
        exts: list[Any] = mypycify(paths, opt_level="3", group_name="headway_native")
    except (Exception, SystemExit) as e:  # mypyc exits on code it refuses: ship plain Python
        # SystemExit's text is only mypy's exit status ("1"); the errors themselves are printed above it
        why = "mypy reported the errors above" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
        print(f"headway: mypyc refused the simulator ({why}); installing plain Python", file=sys.stderr)
        return []
    if os.name == "posix":  # gcc and clang
        for ext in exts:
            # No fused multiply-add: impact's short-queue scores must round each operation as numpy does
            # (tests/test_policy_short.py), also where CFLAGS target a CPU that has FMA.
            ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]
    return exts


if __name__ == "__main__":  # as setuptools runs it; tests load the functions above without building
    commands = {"build_ext": OptionalBuildExt, "build_py": CleanBuildPy}
    setup(ext_modules=native_extensions(), cmdclass=commands)
