"""The simulator's hot modules, compiled with mypyc in a built install (`pip install .`).

An editable install (`pip install -e .`, what `make demo` and `make test` use) keeps them as plain
Python, so an edit takes effect at once; `make native` builds the compiled copy that the benchmarks
and the compiled-build tests run. setup.py reads this file by path: keep it free of imports from the
package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util

# Compiling the first three gives ~1.45x the simulator's throughput (CHANGELOG.md, "Performance:
# simulator"; benchmarks/bench_sim.py measures it); the
# policies' shared pass (a function: mypyc's dataclasses break the policies' ClassVars) about 5% more.
NATIVE_MODULES: tuple[str, ...] = (
    "headway.sim.engine",
    "headway.policy.placement",
    "headway.sim.cluster",
    "headway.policy.passes",
)


def compiled_modules() -> list[str]:
    """Which of NATIVE_MODULES this process loads from a compiled extension."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    for name in NATIVE_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and spec.origin.endswith(suffixes):
            out.append(name)
    return out


def build_name() -> str:
    """'native' when every hot module is compiled, 'pure' when none is, else 'partial'."""
    n = len(compiled_modules())
    return "native" if n == len(NATIVE_MODULES) else "pure" if n == 0 else "partial"
