"""One exception type for problems a user can fix.

Every error lmlab raises for bad input says what is wrong *and* how to fix it; the CLI prints
both and exits with status 2 instead of a traceback.
"""

from __future__ import annotations


class LmlabError(Exception):
    """A problem with the user's input or environment, with the fix spelled out.

    Args:
        problem: what is wrong, naming the file/value/field involved.
        fix: what the user should do about it (optional but strongly encouraged).
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")
