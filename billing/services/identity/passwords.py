"""How people's passwords are stored: Argon2id, at OWASP's memory and pass counts scaled to the
margin the product had over them (docs/operations.md, "Logins").

Django's default was PBKDF2-SHA256 at 1,000,000 iterations: 0.23 s of CPU per login on this
project's machines (nine tenths of a login's whole CPU), which a loaded host turned into 1-5 s
(docs/benchmarks.md, "Login"). A GPU computes PBKDF2 thousands of times faster than a server core;
Argon2id is memory-hard, so the guesser's cost is set by memory and bandwidth per guess, not by
the server's CPU. OWASP's Password Storage Cheat Sheet gives 600,000 iterations as PBKDF2-SHA256's
minimum and 19 MiB with 2 passes as Argon2id's; we keep the margin the 1,000,000 iterations had
over theirs (5/3) on Argon2id's memory: 32 MiB, 2 passes, one lane, about 0.07 s of CPU.

Passwords stored with PBKDF2 still verify (the hasher stays in PASSWORD_HASHERS, second) and are
rewritten as Argon2id at the user's next successful login, as Django does when the preferred
hasher or its parameters change."""

from __future__ import annotations

from django.contrib.auth.hashers import Argon2PasswordHasher

__all__ = ["Argon2idHasher"]


class Argon2idHasher(Argon2PasswordHasher):
    """Django's Argon2 hasher (argon2id, argon2-cffi) with the parameters above."""

    time_cost = 2  # passes
    memory_cost = 32 * 1024  # KiB
    parallelism = 1  # one lane: a login uses one core and leaves the other requests theirs
