"""Predictions at submit time: P(complete), runtime if it completes, time to failure if not."""
