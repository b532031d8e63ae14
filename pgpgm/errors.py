"""Exception and warning types of pgpgm."""


class PgpgmError(Exception):
    """Base class of every error pgpgm raises on purpose."""


class ModelDefinitionError(PgpgmError, ValueError):
    """An ODE system definition is malformed (bad equation string, unknown name, ...)."""


class DataError(PgpgmError, ValueError):
    """Input data are unusable (wrong shape, NaN, unsorted or duplicate times, ...)."""


class UnknownNameError(PgpgmError, KeyError):
    """A name that pgpgm does not know: a shipped model (:func:`pgpgm.load_model`), a model's case. The message
    lists the names it knows. (A ``KeyError`` too, as a missing key of a mapping is.)"""

    def __str__(self) -> str:  # the message as written, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


class MissingFileError(DataError, FileNotFoundError):
    """A file the user named does not exist (a model file for :func:`pgpgm.load_model`). A
    ``FileNotFoundError`` too."""


class LaplaceError(DataError):
    """The Laplace approximation does not exist at the optimum: its covariance is not finite (the data do not
    determine every unknown) or its Gaussian lies almost wholly outside the bounds. ``pgpgm.fit`` and
    ``pgpgm.fit_petab`` catch it and return steps 1-3 with an :class:`IdentifiabilityWarning`."""


class ODESolveError(PgpgmError, RuntimeError):
    """A numerical ODE solve failed (solver error flag, too many steps, non-finite state)."""


class SamplingError(PgpgmError, RuntimeError):
    """Step 2 cannot run: no chain start with a finite density from an ``init`` strategy
    (prior median, prior draws, the density's mode), or a sampling worker process failed.
    A start the user gave that has no finite density is a :class:`DataError`."""


class StartError(SamplingError):
    """Step 4's NUTS cannot start: the log density or its gradient is not finite at every initial
    point it tried (nutpie's "All initialization points failed", PyMC's "Initial evaluation of model at
    starting point failed"), e.g. a refined parameter on a bound where the model cannot be solved.
    ``pgpgm.fit`` catches it and returns steps 1-3 with a warning."""


class BackendWarning(UserWarning):
    """pgpgm uses a slower ODE backend than the compiled CVODE one (``pgpgm info`` says why)."""


class ResultFileError(PgpgmError, OSError):
    """A result file cannot be written or read: missing, truncated, damaged (its checksum does
    not match) or not written by :meth:`pgpgm.FitResult.save`."""


class IdentifiabilityWarning(UserWarning):
    """The data do not determine some unknowns (a rank-deficient Jacobian, an unbounded likelihood)."""


class CompetingOptimaWarning(IdentifiabilityWarning):
    """The data fit (nearly) as well at another point than at the refined one: a symmetry of the
    model (two parameters exchanged) or a second optimum. The estimates and step 4's posterior
    describe the refined point's optimum only (``result.competing_optima`` lists the others)."""


class ConvergenceWarning(UserWarning):
    """A posterior failed a convergence check (R-hat > 1.01, ESS < 400 or divergences)."""


class PrecisionWarning(UserWarning):
    """Step 4's posterior passed its convergence checks, but some sd is known less precisely than
    ``pgpgm.NUTS(sd_error=)`` asks (its Monte Carlo error over the sd): the budget's share for sharper sds,
    the most draws, or draws with divergences ended the chains first."""


class BoundWarning(UserWarning):
    """An estimate sits on a bound of its Uniform prior (the refined value, or a large part of the
    posterior): the prior probably cuts off the best fit; widen it."""


class StartTimeWarning(UserWarning):
    """Known initial values hold at the default start, the first measured time, which is not 0: where they
    hold at another time (a dose at 0, the first sample later), give ``t0``."""
