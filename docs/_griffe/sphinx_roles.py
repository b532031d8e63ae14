"""A griffe extension for the docs build: Sphinx roles in pgpgm's docstrings shown as code.

The docstrings cross-reference with Sphinx roles (``:func:`pgpgm.sample```, ``:class:`~pgpgm.errors.BoundWarning```);
mkdocstrings does not read them, so they would show as raw text. This writes each as inline code
(the target's last component when it starts with ``~``). Only the rendered site changes.
"""

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const)\.?:`(~?)([^`]+)`")


def _code(match: re.Match) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
