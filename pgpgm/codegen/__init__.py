"""Code generation shared by the layers that compile model code (``ode``, ``gp``, ``solve``,
``matching``): ``printer`` (sympy expressions to numba source that never raises), ``templates``
(a jitted template specialised to a model function) and ``cache`` (generated modules on disk,
compiled once per model and reused by every later process). It knows nothing of ODEs.
"""
