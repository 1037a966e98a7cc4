"""Benchmarks (not tests: they report numbers and never assert on speed). See bench/README.md."""
