"""Who may submit which priority class: `classes.toml` in the state directory.

    [classes]
    high = ["alice", "@ml-leads"]    # users, or @groups (primary or supplementary)
    urgent = ["@oncall"]
    # low = ["*"]                    # "*" is everyone

A class the file does not list keeps its default: `low` and `normal` for everyone, `high` and `urgent`
for nobody. Root (and the user a personal daemon runs as) may use every class. Without this any user
could submit `--priority urgent` and jump the queue.

The file is read again whenever it changes. It counts only if the daemon's user (or root) owns it and
nobody else may write it; a file that is broken, or writable by others, gives the defaults (so nobody
but root gets `high` or `urgent`) and the refusal names the problem.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from headway.local.protocol import PRIORITIES

CLASSES_FILE = "classes.toml"
EVERYONE = "*"
DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "low": (EVERYONE,),
    "normal": (EVERYONE,),
    "high": (),
    "urgent": (),
}
MAX_FILE_BYTES = 64 * 1024

log = logging.getLogger("headway.daemon")


class ClassPolicyError(ValueError):
    """classes.toml cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    allowed: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULTS))
    problem: str = ""  # why the file was not used ("" if it was, or there is none)

    def may_use(self, klass: str, user: str, gids: frozenset[int]) -> bool:
        for who in self.allowed.get(klass, ()):
            if who in (EVERYONE, user):
                return True
            if who.startswith("@"):
                with contextlib.suppress(KeyError):
                    if grp.getgrnam(who[1:]).gr_gid in gids:
                        return True
        return False

    def who(self, klass: str) -> str:
        names = self.allowed.get(klass, ())
        return "everyone" if EVERYONE in names else ", ".join(names) or "root only"


def parse(text: str, where: str) -> ClassPolicy:
    """The policy a file's text gives (raises ClassPolicyError naming the problem)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ClassPolicyError(f"{where}: {e}") from None
    unknown = [k for k in data if k != "classes"]
    if unknown:
        raise ClassPolicyError(f"{where}: unknown table or key {unknown[0]!r} (only [classes])")
    table = data.get("classes", {})
    if not isinstance(table, dict):
        raise ClassPolicyError(f"{where}: [classes] must be a table")
    allowed = dict(DEFAULTS)
    for klass, names in table.items():
        if klass not in PRIORITIES:
            raise ClassPolicyError(f"{where}: unknown class {klass!r} (classes: {', '.join(PRIORITIES)})")
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise ClassPolicyError(
                f'{where}: {klass} must be a list of users and @groups, e.g. ["alice", "@ml"]'
            )
        allowed[klass] = tuple(names)
    return ClassPolicy(allowed)


@dataclass(slots=True)
class ClassPolicyFile:
    """classes.toml, read again when it changes (its inode, size, times or mode)."""

    path: Path
    owner_uid: int  # the daemon's user: the file must be theirs or root's
    _key: tuple[int, ...] | None = None
    _policy: ClassPolicy = field(default_factory=ClassPolicy)

    def current(self) -> ClassPolicy:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._key, self._policy = None, ClassPolicy()
            return self._policy
        except OSError as e:
            return self._use((-1,), ClassPolicy(problem=f"{self.path}: {e.strerror or e}"))
        try:
            st = os.fstat(fd)
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)
            if key == self._key:
                return self._policy
            if not stat.S_ISREG(st.st_mode):
                return self._use(key, ClassPolicy(problem=f"{self.path}: not a regular file"))
            if st.st_uid not in (0, self.owner_uid) or st.st_mode & 0o022:
                return self._use(
                    key, ClassPolicy(problem=f"{self.path}: others may write it, so it is ignored")
                )
            if st.st_size > MAX_FILE_BYTES:
                return self._use(key, ClassPolicy(problem=f"{self.path}: larger than 64 KiB"))
            data = os.read(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            policy = parse(data.decode("utf-8"), str(self.path))
        except UnicodeDecodeError:
            policy = ClassPolicy(problem=f"{self.path}: not UTF-8 text")
        except ClassPolicyError as e:
            policy = ClassPolicy(problem=str(e))
        return self._use(key, policy)

    def _use(self, key: tuple[int, ...], policy: ClassPolicy) -> ClassPolicy:
        if key != self._key:
            if policy.problem:
                log.warning(
                    "priority classes: %s; only low and normal for users until it is fixed", policy.problem
                )
            else:
                log.info(
                    "priority classes from %s: %s",
                    self.path,
                    "; ".join(f"{k}: {policy.who(k)}" for k in PRIORITIES),
                )
        self._key, self._policy = key, policy
        return policy
