"""Checks that keep a root daemon from being steered by its users through the files it uses.

A daemon running as root writes, creates and chowns files in its state directory on behalf of every user.
If any part of that directory's path can be changed by another user (owned by them, or writable by them),
they can put a link where the daemon will open a log and have a root file handed to them. So a root
daemon uses a path only where every component, from / down, is owned by root (or the daemon's own uid)
and not writable by group or others; a world-writable directory with the sticky bit (/tmp) is allowed
above it, never as the state directory itself.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

MAX_LINKS = 40  # symbolic links followed while walking one path (the kernel's own limit)


class UnsafePath(RuntimeError):
    """A component of a path someone other than the daemon's owner could change; the message names it."""


def _who(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _check(path: str, st: os.stat_result, my_uid: int, last: bool) -> None:
    if st.st_uid not in (0, my_uid):
        raise UnsafePath(f"{path}: owned by {_who(st.st_uid)} (uid {st.st_uid})")
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return  # a link's own mode means nothing; its target is walked
    writable = mode & 0o022
    if writable and (last or not (stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX)):
        who = "group and others" if mode & 0o022 == 0o022 else ("others" if mode & 0o002 else "its group")
        sticky = "" if last else ", without the sticky bit"
        raise UnsafePath(f"{path}: writable by {who} (mode {mode:04o}{sticky})")


def check_path(path: Path, my_uid: int) -> None:
    """Raise UnsafePath naming the first component of `path` (walked from / down, following symbolic
    links and walking their targets too) that a user other than root or `my_uid` could change. Parts that
    do not exist yet are not checked (the daemon creates them); call again once they exist."""
    todo = list(Path(os.path.abspath(path)).parts[1:])
    cur = "/"
    _check(cur, os.lstat(cur), my_uid, last=not todo)
    links = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = os.path.dirname(cur) or "/"
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return
        _check(nxt, st, my_uid, last=not todo)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise UnsafePath(f"{path}: more than {MAX_LINKS} symbolic links")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo = [p for p in Path(target).parts if p != "/"] + todo
            continue
        cur = nxt


def check_own_file(path: Path, my_uid: int) -> None:
    """A file the daemon itself opens in its state dir (its database, its log, its lock): if it is there,
    it must be no link and be the daemon's owner's, or a user who once could write the dir left a trap."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{path}: a symbolic link where the daemon keeps its own file")
    if st.st_uid not in (0, my_uid):
        raise UnsafePath(f"{path}: owned by {_who(st.st_uid)} (uid {st.st_uid})")


def reachable_by_others(path: Path) -> bool:
    """Whether users other than root can reach `path` (every directory on the way searchable by others):
    a daemon whose state dir they cannot reach serves no one but its owner."""
    p = Path(os.path.realpath(path))
    for d in (p, *p.parents):
        try:
            if not os.stat(d).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _ids_in(directory: Path) -> int:
    """The largest job id named by the entries of logs/ (`<id>.out`) or runs/ (`<id>.<attempt>`)."""
    top = 0
    try:
        with os.scandir(directory) as it:
            for entry in it:
                head = entry.name.split(".", 1)[0]
                if head.isascii() and head.isdigit():
                    top = max(top, int(head))
    except FileNotFoundError:
        pass
    return top


def earlier_jobs(state_dir: Path, store: Path) -> tuple[int, str, str]:
    """The highest job id this queue is known to have given, from outside its database: logs/, runs/ and
    the job store's local jobs. Returns (id, where it was seen, a warning when the store could not be
    read, else ""). The database is checked against it and its ids go on after it."""
    found = {"logs/": _ids_in(state_dir / "logs"), "runs/": _ids_in(state_dir / "runs")}
    note = ""
    if store.exists():
        from headway.local.store_sync import max_local_id

        try:
            found[f"the job store {store}"] = max_local_id(store)
        except Exception as e:  # held by a writer, damaged: the logs still count; the store's own guard
            note = f"the job store {store} could not be read to check job ids ({str(e).splitlines()[0]})"
    top = max(found.values())
    where = ", ".join(f"{k} up to job {v}" for k, v in found.items() if v)
    return top, where, note
