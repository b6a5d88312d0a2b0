"""Compile the simulator's hot modules with mypyc when building a wheel (`pip install .`).

The metadata lives in pyproject.toml. An editable install stays plain Python (a compiled module would
shadow edits to its source), and so does any build where HEADWAY_PURE=1 or compiling fails (no C
compiler or no Python headers): the same code then runs, only slower.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

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


# setuptools runs this file once per step of a build (pip: requirements, metadata, then the wheel). These
# steps build no extension, so mypyc (a full mypy run, C files written under build/) would only cost time:
# three runs for one `pip install .`, two for an editable install, which then compiles nothing.
NO_EXTENSIONS = frozenset({"egg_info", "dist_info", "sdist", "editable_wheel"})


def _command() -> str | None:
    """The setup command (setuptools' backend may put global options before it)."""
    return next((a for a in sys.argv[1:] if not a.startswith("-")), None)


def native_extensions() -> list[Any]:
    if os.environ.get("HEADWAY_PURE") == "1" or "editable_wheel" in sys.argv or _command() in NO_EXTENSIONS:
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
    return exts


if __name__ == "__main__":  # as setuptools runs it; tests load the functions above without building
    setup(ext_modules=native_extensions(), cmdclass={"build_ext": OptionalBuildExt})
