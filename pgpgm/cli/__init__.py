"""The ``pgpgm`` command, on the public API: ``command`` (the parser, one handler per subcommand, :func:`main`)
and ``inputs`` (the tidy CSV reader and the command's two kinds of failure)."""

from .command import main
from .inputs import FitFailed, UsageError, read_tidy_csv

__all__ = ["FitFailed", "UsageError", "main", "read_tidy_csv"]
