"""Where each user's message goes: an addresses file (`user email` or `user,email` per line), else
`user@DOMAIN`. A user with neither has no address, and is reported and skipped by the email channel."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

# Deliberately loose: one @, something either side, no spaces or separators. The server decides the rest.
_EMAIL = re.compile(r"^[^\s@,;<>]+@[^\s@,;<>]+$")
_DOMAIN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")


class AddressError(ValueError):
    """An addresses file or --domain that cannot be read; str() is the one-line message."""


def is_email(text: str) -> bool:
    return bool(_EMAIL.match(text))


@dataclass(slots=True)
class AddressBook:
    """The file's users (first) and the domain (else); `lookup` gives None for a user with neither."""

    by_user: dict[str, str] = field(default_factory=dict)
    domain: str | None = None

    def lookup(self, user: str) -> str | None:
        if user in self.by_user:
            return self.by_user[user]
        if self.domain and is_email(f"{user}@{self.domain}"):
            return f"{user}@{self.domain}"
        return None

    def any(self) -> bool:
        return bool(self.by_user or self.domain)


def check_domain(domain: str) -> str:
    d = domain.strip().lstrip("@")
    if not _DOMAIN.match(d):
        raise AddressError(f"--domain {domain!r}: expected a mail domain such as example.org")
    return d


def read_addresses(path: Path) -> dict[str, str]:
    """`user email` (whitespace between) or `user,email` (CSV) per line; blank lines and lines starting
    with # are skipped, and so is a first line `user,email` (a CSV header). A user given twice is an
    error: which address is meant cannot be guessed."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise AddressError(f"--addresses {path}: no such file") from None
    except UnicodeDecodeError:
        raise AddressError(f"--addresses {path}: not a UTF-8 text file") from None
    except OSError as e:
        raise AddressError(f"--addresses {path}: cannot read it: {e.strerror or e}") from None
    out: dict[str, str] = {}
    where: dict[str, int] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        fields = next(csv.reader([s])) if "," in s else s.split()
        fields = [f.strip() for f in fields]
        if no == 1 and [f.lower() for f in fields] in (["user", "email"], ["user", "address"]):
            continue
        if len(fields) != 2 or not fields[0]:
            raise AddressError(
                f"--addresses {path}, line {no}: expected `user email` or `user,email`, got {s[:60]!r}"
            )
        user, email = fields
        if not is_email(email):
            raise AddressError(f"--addresses {path}, line {no}: {email[:60]!r} is not an email address")
        if user in out:
            raise AddressError(
                f"--addresses {path}, line {no}: user {user!r} already given on line {where[user]}"
            )
        out[user] = email
        where[user] = no
    return out
