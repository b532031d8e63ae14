"""A jitted template specialised to one model's function, so numba can cache it.

numba cannot cache code that receives a jitted function as an argument. A template is written as
``@numba.njit(cache=False) def template(func, a, b, ...)`` (its first argument the model function it
calls); :func:`specialise` returns its source with that argument turned into a global of the module
the source is placed in, under a new name, compiled with ``cache=True``.
"""

from __future__ import annotations

import inspect


def specialise(template, argument: str, name: str) -> str:
    """The source of ``template`` (a ``numba.njit(cache=False)`` dispatcher whose first parameter is
    ``argument``) as a cached function ``name`` that calls the module global ``argument`` instead.

    Raises
    ------
    ValueError
        when the template's source does not start with ``@numba.njit(cache=False)`` and
        ``def <template>(<argument>, `` (a template in pgpgm that does not follow the convention).
    """
    src = inspect.getsource(template.py_func)
    head = f"@numba.njit(cache=False)\ndef {template.__name__}({argument}, "
    if not src.startswith(head):
        raise ValueError(f"{template.__name__} is not a template: its source must start with {head!r}")
    return f"@numba.njit(cache=True)\ndef {name}(" + src[len(head):]
