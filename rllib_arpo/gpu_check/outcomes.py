"""What a piece of ``rllib check-gpu`` ends in: PASS, FAIL or SKIP, and the two exceptions a piece
raises to say why it skipped (``Skip``) or failed (``CheckFailed``; any other exception is a FAIL
too)."""

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


class Skip(Exception):
    """The piece cannot run on this machine; the message says why."""


class CheckFailed(Exception):
    """The piece ran and its result is wrong; the message says how."""
