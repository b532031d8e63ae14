"""Exception types raised by pgpgm."""


class PgpgmError(Exception):
    """Base class of every error pgpgm raises on purpose."""


class ModelDefinitionError(PgpgmError, ValueError):
    """An ODE system definition is malformed (bad equation string, unknown name, ...)."""


class DataError(PgpgmError, ValueError):
    """Input data are unusable (wrong shape, NaN, unsorted or duplicate times, ...)."""


class ODESolveError(PgpgmError, RuntimeError):
    """A numerical ODE solve failed (solver error flag, too many steps, non-finite state)."""


class IdentifiabilityWarning(UserWarning):
    """The data do not determine some unknowns (a rank-deficient Jacobian, an unbounded likelihood)."""
