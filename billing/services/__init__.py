"""Writes and business rules. Plain functions with keyword arguments and an explicit `now`."""
