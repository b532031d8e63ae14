"""The steps of a fit, each a module with its typed input and output, in the order a fit runs them:
``options`` -> ``prepare`` -> ``match`` (steps 1-2) -> ``refine`` (step 3) -> ``posterior`` (step 4) -> ``report``.
:func:`pgpgm.fit` and :func:`pgpgm.fit_study` (:mod:`pgpgm.fitting`) are compositions of them."""
