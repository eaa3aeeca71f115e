"""The command line, the top of the house: argument parsing and printing, nothing else.

`main` builds the parser and dispatches; each command's options and body live in its own
module (`run`, `info`: ls, evaluate, leaderboard, validate and data, `show`, `check`, `cost`,
`tune`, `compare`). User errors print one line `error: ...` and exit with status 2.

The modules import harness.report (pandas, matplotlib) inside the handlers that write
reports, so that a command which writes none, `evaluate` above all, starts without them.
"""

from harness.cli.program import main

__all__ = ["main"]
