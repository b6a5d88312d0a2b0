"""headway: make shared GPU clusters spend their GPU-hours on jobs that finish."""

__version__ = "0.1.0"
