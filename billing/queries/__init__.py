"""Reads. Every query that returns tenant data takes the caller's scope and filters in SQL."""
