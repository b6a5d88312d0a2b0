"""Delivery: email over SMTP (stdlib smtplib) and a Slack-style webhook (stdlib urllib), both with a timeout.

Every failure a user can cause (a bad --smtp, a server that is not there, a webhook answering an HTTP error)
is a `SendError` whose str() is one line naming the server or the URL.
"""

from __future__ import annotations

import json
import smtplib
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from types import TracebackType

from headway.notify.compose import Message

TIMEOUT_S = 10.0


class SendError(RuntimeError):
    """A delivery that cannot go ahead; str() is the one-line message."""


class RecipientRefused(SendError):
    """The SMTP server refused this one recipient: the others can still be sent."""


@dataclass(frozen=True, slots=True)
class SmtpServer:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_smtp(text: str) -> SmtpServer:
    """`HOST:PORT` (`[::1]:25` for an IPv6 address)."""
    s = text.strip()
    if s.startswith("["):
        host, sep, rest = s[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        ok = bool(sep)
    else:
        host, _, port_text = s.rpartition(":")
        ok = ":" not in host
    if not ok or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise SendError(f"--smtp {text!r}: expected HOST:PORT, e.g. localhost:25 or mail.example.org:587")
    return SmtpServer(host, int(port_text))


def check_webhook(url: str) -> str:
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SendError(f"--webhook {url!r}: expected an http:// or https:// URL")
    return url.strip()


def shown_url(url: str) -> str:
    """The URL without its path: a Slack webhook's path is its secret, and errors land in logs."""
    parts = urllib.parse.urlsplit(url)
    return (
        f"{parts.scheme}://{parts.netloc}/…"
        if parts.path not in ("", "/")
        else f"{parts.scheme}://{parts.netloc}"
    )


class Mailer:
    """One SMTP session for a run: connect on entry, `send` each message, QUIT on exit."""

    def __init__(self, server: SmtpServer, sender: str, timeout: float = TIMEOUT_S) -> None:
        self.server = server
        self.sender = sender
        self.timeout = timeout
        self._smtp: smtplib.SMTP | None = None

    def __enter__(self) -> Mailer:
        try:
            self._smtp = smtplib.SMTP(self.server.host, self.server.port, timeout=self.timeout)
        except (socket.gaierror, socket.herror):
            raise SendError(f"--smtp {self.server}: unknown host {self.server.host}") from None
        except TimeoutError:
            raise SendError(f"--smtp {self.server}: no answer within {self.timeout:g} s") from None
        except (OSError, smtplib.SMTPException) as e:
            raise SendError(f"--smtp {self.server}: cannot reach the mail server: {_why(e)}") from None
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._smtp is not None:
            try:
                self._smtp.quit()
            except (OSError, smtplib.SMTPException):
                self._smtp.close()

    def send(self, m: Message) -> None:
        assert self._smtp is not None and m.to is not None
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = m.to
        msg["Subject"] = m.subject
        msg["Date"] = formatdate(localtime=False, usegmt=True)
        msg["Message-ID"] = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        msg["X-Headway-Fingerprint"] = m.fingerprint
        msg.set_content(m.body)
        try:
            self._smtp.send_message(msg)
        except smtplib.SMTPRecipientsRefused as e:
            code, text = next(iter(e.recipients.values()), (0, b""))
            raise RecipientRefused(f"--smtp {self.server}: refused {m.to} ({code} {_text(text)})") from None
        except smtplib.SMTPResponseException as e:
            raise SendError(f"--smtp {self.server}: {e.smtp_code} {_text(e.smtp_error)}") from None
        except (OSError, smtplib.SMTPException) as e:
            raise SendError(
                f"--smtp {self.server}: the mail server dropped the connection: {_why(e)}"
            ) from None


def post_webhook(url: str, m: Message, timeout: float = TIMEOUT_S) -> None:
    """POST `{"text", "user", "subject"}` as JSON (Slack's incoming-webhook shape, plus two fields)."""
    data = json.dumps({"text": m.text, "user": m.user, "subject": m.subject}).encode()
    req = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", "User-Agent": "headway"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as e:
        raise SendError(f"--webhook {shown_url(url)}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise SendError(f"--webhook {shown_url(url)}: cannot reach it: {_why(e.reason)}") from None
    except TimeoutError:
        raise SendError(f"--webhook {shown_url(url)}: no answer within {timeout:g} s") from None
    except OSError as e:
        raise SendError(f"--webhook {shown_url(url)}: {_why(e)}") from None


def _text(b: bytes | str) -> str:
    s = b.decode(errors="replace") if isinstance(b, bytes) else str(b)
    return " ".join(s.split())


def _why(e: object) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return (str(e).splitlines() or [type(e).__name__])[0]
