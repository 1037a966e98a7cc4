"""Reproducible experiments on public traces (run as ``python -m allocator.experiments.<name>``)."""
