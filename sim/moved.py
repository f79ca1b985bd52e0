"""Old module names of a package laid out anew: each still imports, as the module it is now.

:func:`keep_old_names` registers a package's map ``{old module name: new module name}`` (``verification.MOVED``,
``llm_runs.MOVED``) with one finder at the front of ``sys.meta_path``. Importing an old name then imports the new module and
returns that very module object (so a monkeypatch or an ``isinstance`` through either name is the same), with a
:class:`DeprecationWarning` naming where it is now; ``python -m OLD`` runs the new module's code. Nothing is
copied and no file is left at the old place.

This module imports only the standard library, so that a package's ``__init__`` can register its map at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Mapping
from types import CodeType, ModuleType

__all__ = ["keep_old_names"]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name of :attr:`moved` as the module it is now, with a DeprecationWarning."""

    def __init__(self) -> None:
        self.moved: dict[str, str] = {}

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        target = importlib.util.find_spec(self.moved[fullname])  # its file is the old name's (runpy's __file__)
        return importlib.util.spec_from_loader(fullname, self, origin=None if target is None else target.origin)

    def _warn(self, old: str) -> str:
        new = self.moved[old]
        warnings.warn(f"{old} is now {new}; import it from there", DeprecationWarning, stacklevel=3)
        return new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._warn(spec.name))

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported under its new name."""

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, for ``python -m OLD`` (runpy runs it as ``__main__``)."""
        new = self._warn(fullname)
        spec = importlib.util.find_spec(new)
        if spec is None or not isinstance(spec.loader, importlib.abc.InspectLoader):
            raise ImportError(f"{fullname} is now {new}, which has no code to run")
        return spec.loader.get_code(new)


_FINDER = _MovedModules()


def keep_old_names(moved: Mapping[str, str]) -> None:
    """Make every old module name of ``moved`` (``{old: new}``) import as its new module (module docstring).
    Raises ValueError naming an old name that some package already maps elsewhere."""
    for old, new in moved.items():
        if _FINDER.moved.get(old, new) != new:
            raise ValueError(f"old module name {old!r} is already kept as {_FINDER.moved[old]!r}, not {new!r}")
    _FINDER.moved.update(moved)
    if _FINDER not in sys.meta_path:  # first: an old name may also be a folder (``llm_runs/data/``), which the path
        sys.meta_path.insert(0, _FINDER)  # finder would import as a namespace package
