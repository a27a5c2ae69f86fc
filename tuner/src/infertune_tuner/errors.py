"""Errors a user can fix. The CLI prints them without a traceback and exits with their code."""

from __future__ import annotations

EXIT_INVALID = 2  # bad input: an unknown model, an unreadable file, an impossible request


class InputError(Exception):
    """Bad input: an unknown model or GPU, an unreadable file, an impossible request.

    ``problems`` holds one line per problem (``path: message``) when there are several;
    ``exit_code`` is what the command line exits with (2 unless the error says otherwise).
    """

    def __init__(
        self, message: str, problems: list[str] | None = None, *, exit_code: int = EXIT_INVALID
    ) -> None:
        super().__init__(message)
        self.problems = problems or []
        self.exit_code = exit_code

    def __str__(self) -> str:
        if not self.problems:
            return super().__str__()
        return super().__str__() + "\n" + "\n".join(f"  - {p}" for p in self.problems)
