"""Errors users see.  Each names the thing and the place; the CLI prints str(e) on one
line and exits non-zero, never a traceback.  Anything else escaping is a bug."""


class UserError(Exception):
    """Bad input from the user (file, query, option, schema).  CLI exit code 2."""
    exit_code = 2


class Rejected(UserError):
    """A program the verifier (or the language's checks) refused.  CLI exit code 1."""
    exit_code = 1
