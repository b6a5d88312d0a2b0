"""The embedded single-server queue: a daemon, its job supervisors, and the clients that talk to it.

Kept import-light: `python -m headway.local.supervisor` starts once per job.
"""
