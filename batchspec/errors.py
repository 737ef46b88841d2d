"""The one exception type that reaches the user as a single line and exit code 2."""


class UserError(Exception):
    """Bad input from the user (spec, files, columns, models): printed as one line, exit 2."""

    exit_code = 2
