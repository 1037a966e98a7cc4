"""Allocation algorithms shared by the node agent and the service.

Pure Python (+numpy), deterministic, frozen dataclasses in and out; no Django,
no ``agents``, no ``billing`` imports.
"""

from allocator.fairshare import Allocation, Claim, fair_share

__all__ = ["Allocation", "Claim", "fair_share"]
