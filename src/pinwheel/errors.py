"""One error type for every stage: what went wrong, where, and what to run next.

The CLI prints ``str(err)`` and exits with ``err.exit_code``; the codes are
documented in the README ("Exit codes") and stay stable for scripts and CI.
"""

from __future__ import annotations

# Exit codes (README: "Exit codes").
EXIT_OK = 0
EXIT_ERROR = 1  # anything not listed below (I/O, git, network)
EXIT_USAGE = 2  # bad manifest or bad command line
EXIT_DRIFT = 3  # a PR head moved (force-push) or upstream drifted
EXIT_CONFLICT = 4  # a step does not apply
EXIT_MISMATCH = 5  # replayed tree differs from [result].tree, or a rebuild differs
EXIT_VERIFY = 6  # checksum, signature or artifact check failed
EXIT_GATE = 7  # a qualification gate failed


class PinwheelError(Exception):
    """An error a user can act on.

    ``what``  -- one line saying what was wrong.
    ``where`` -- the step, PR, commit, file (and line) it concerns.
    ``next``  -- the command to run next, or the edit to make.
    """

    exit_code = EXIT_ERROR

    def __init__(self, what: str, *, where: str | None = None, next: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.next = next

    def __str__(self) -> str:
        head = f"{self.where}: {self.what}" if self.where else self.what
        return f"{head}\n  next: {self.next}" if self.next else head


class ManifestError(PinwheelError):
    exit_code = EXIT_USAGE


class UsageError(PinwheelError):
    exit_code = EXIT_USAGE


class DriftError(PinwheelError):
    exit_code = EXIT_DRIFT


class ConflictError(PinwheelError):
    exit_code = EXIT_CONFLICT

    def __init__(self, what: str, *, files: tuple[str, ...] = (), **kw: str | None):
        super().__init__(what, **kw)
        self.files = files

    def __str__(self) -> str:
        text = super().__str__()
        if not self.files:
            return text
        listing = "\n".join(f"    {f}" for f in self.files)
        return f"{text}\n  conflicting files:\n{listing}"


class MismatchError(PinwheelError):
    exit_code = EXIT_MISMATCH


class VerifyError(PinwheelError):
    exit_code = EXIT_VERIFY


class GateFailed(PinwheelError):
    exit_code = EXIT_GATE
