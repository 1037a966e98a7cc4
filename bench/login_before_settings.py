"""bench/login.py's "before" server: the product's settings with Django's default password hashers
(PBKDF2-SHA256 first, 1,000,000 iterations) and Django's own LoginView (bench/login_before_urls.py),
as the product ran before it stored passwords with Argon2id and answered a login with the role's page."""

from config.settings import *  # noqa: F403 - the product's settings, two of them replaced below

PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
]
ROOT_URLCONF = "bench.login_before_urls"
