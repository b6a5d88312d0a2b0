"""Writing an output file so that a failed write never leaves half of it: the one helper behind every
report, trace, model and export headway writes (`simulate --html`, `audit --html`, `demo --html`,
`synth --out`, `predict train --out`, `export --parquet`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` to write; on success it replaces `path` in one rename, on any
    failure (a full disk, Ctrl-C) it is removed: a failed write leaves neither half a file nor the
    previous one destroyed. A FIFO or a device (/dev/stdout, /dev/null) is written through, a
    symlink's target is replaced (the link stays), and a writable file in a directory that is not
    writable is written in place. The new file gets the mode and owner of the file it replaces, or the
    mode a new file gets under the umask (mkstemp's own is 0600)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        yield path
        return
    path = path.resolve() if path.is_symlink() else path
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        if path.is_file() and os.access(path, os.W_OK):
            yield path
            return
        raise
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        try:
            old = path.stat()
        except FileNotFoundError:
            os.chmod(tmp, 0o666 & ~_umask())
        else:
            if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                # root replacing a user's file: the user keeps it (refused, and left, for anyone else)
                with contextlib.suppress(OSError):
                    os.chown(tmp, old.st_uid, old.st_gid)
            os.chmod(tmp, old.st_mode & 0o7777)  # after chown, which may clear set-id bits
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
