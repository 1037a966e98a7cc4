#!/usr/bin/env python
"""Django's command-line utility."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line  # noqa: PLC0415 - after DJANGO_SETTINGS_MODULE is set, as Django's template has it

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
