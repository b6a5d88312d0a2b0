"""Live adapter for a real Slurm cluster: read the queue and history, write impact into SiteFactor.

headway never replaces Slurm here: it ranks pending jobs with the same policy core as the simulator and
turns the ranking into `scontrol update JobId=N SiteFactor=X`, so Slurm's own backfill, QOS and
reservations keep working and `sprio` shows headway's part.
"""
