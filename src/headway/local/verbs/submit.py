"""`submit`: queue a command as the calling user, in the priority class the class policy allows them."""

from __future__ import annotations

import json
import logging
import os
import pwd
import sqlite3
import time
from typing import TYPE_CHECKING

from headway.local.classes import CLASSES_FILE
from headway.local.core import JobState, LocalJob, Submitted
from headway.local.db import path_value
from headway.local.protocol import MAX_NAME_CHARS, RequestError, Submit, SubmitReply
from headway.local.server import Caller

if TYPE_CHECKING:
    from headway.local.daemon import Daemon

log = logging.getLogger("headway.daemon")


def default_name(argv0: str) -> str:
    """The command's own name, printable (a tab or newline in it broke every table listing the job)."""
    name = (os.path.basename(argv0) or argv0)[:MAX_NAME_CHARS]
    return "".join(c if c.isprintable() else "?" for c in name)


def check_class(d: Daemon, caller: Caller, user: str, gids: frozenset[int], klass: str) -> None:
    """Refuse a class the policy file does not give this user (root and the daemon's own user: all)."""
    if caller.uid in (0, d.my_uid):
        return
    policy = d.classes.current()
    if policy.may_use(klass, user, gids):
        return
    where = d.state_dir / CLASSES_FILE
    if policy.problem:
        why = f"the class policy cannot be used ({policy.problem})"
    else:
        why = f"allowed: {policy.who(klass)}; the admin grants classes in {where}"
    raise RequestError(f"--priority {klass} is not allowed for {user} ({why})")


def run(d: Daemon, caller: Caller, req: Submit) -> SubmitReply:
    if d.my_uid != 0 and caller.uid != d.my_uid:
        raise RequestError(
            f"this daemon runs as uid {d.my_uid} and cannot run jobs as uid {caller.uid} "
            "(a shared queue needs a daemon started as root)"
        )
    try:
        pw = pwd.getpwuid(caller.uid)
    except KeyError:
        raise RequestError(f"uid {caller.uid} has no passwd entry") from None
    n = len(d.cfg.gpu_ids)
    if req.gpus > n:
        raise RequestError(f"the job asks for {req.gpus} GPUs; this server has {n}")
    if req.after is not None and d.core.state_of(req.after) is None:
        raise RequestError(f"--after {req.after}: no such job")
    groups = sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid)))
    check_class(d, caller, pw.pw_name, frozenset(groups), req.priority)
    name = req.name or default_name(req.argv[0])
    now = time.time()
    db = d._db()
    try:
        with db.transaction():
            jid = db.insert_job(
                {
                    "user": pw.pw_name,
                    "uid": caller.uid,
                    "gid": pw.pw_gid,
                    "groups": json.dumps(groups),
                    "name": name,
                    "argv": json.dumps(list(req.argv)),
                    "cwd": path_value(req.cwd),
                    "env": json.dumps(dict(req.env)),
                    "gpus": req.gpus,
                    "time_limit": req.time_limit,
                    "priority": req.priority,
                    "after": req.after,
                    "submit_time": now,
                    "state": JobState.PENDING.value,
                    "preemptible": int(req.preemptible),
                    "checkpoint_every": req.checkpoint_every,
                }
            )
            job = LocalJob(
                id=jid,
                user=pw.pw_name,
                uid=caller.uid,
                name=name,
                gpus=req.gpus,
                submit_time=now,
                time_limit=req.time_limit,
                priority=req.priority,
                after=req.after,
                preemptible=req.preemptible,
                checkpoint_every=req.checkpoint_every,
            )
            step = d.core.handle(Submitted(job))
            db.log_events(now, step.log)
    except sqlite3.Error as e:
        d._resync()  # the core heard of the job inside the transaction that failed
        log.error("submit of %r by %s not stored: %s", name, pw.pw_name, e)
        raise RequestError(f"the job was not queued: the queue's database cannot be written ({e})") from None
    d.dirty = True
    d.wake.set()
    return SubmitReply(jid, name, pw.pw_name)
