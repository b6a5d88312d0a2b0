"""`headway notify`: one message per user with what they can act on (docs/notify.md).

facts.py computes each user's facts from the store (mostly the audit's own figures), compose.py turns them
into a subject, a body and a fingerprint, addresses.py finds where they go, send.py delivers them (SMTP,
webhook) and sent.py keeps the store's record of what went, so the same facts are never sent twice.
"""

from __future__ import annotations

from headway.notify.compose import Message, compose, fingerprint
from headway.notify.facts import UserFacts, user_facts

__all__ = ["Message", "UserFacts", "compose", "fingerprint", "user_facts"]
