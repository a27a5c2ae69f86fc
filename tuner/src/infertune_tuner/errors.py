"""Errors a user can fix. The CLI prints them without a traceback and exits 2."""

from __future__ import annotations


class InputError(Exception):
    """Bad input: an unknown model or GPU, an unreadable file, an impossible request.

    ``problems`` holds one line per problem (``path: message``) when there are several.
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []

    def __str__(self) -> str:
        if not self.problems:
            return super().__str__()
        return super().__str__() + "\n" + "\n".join(f"  - {p}" for p in self.problems)
