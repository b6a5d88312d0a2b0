"""Readers: every job log format into the one job schema (headway.schema.JOB_SCHEMA)."""
