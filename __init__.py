"""Not a module of Rollplan: this file marks a Rollplan checkout.

A script run next to a checkout folder named ``rollplan`` would import the folder as an
empty namespace package instead of the installed ``rollplan`` and fail with ``cannot import
name 'Client' from 'rollplan' (unknown location)``. Imported under that name, this file
hands the import over to the installed package (an editable install's finder, or
site-packages) or, if there is none, says what is wrong.
"""

import importlib.machinery
import importlib.util
import os
import sys

if __name__ == "rollplan":
    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = None
    for _finder in sys.meta_path:
        if isinstance(_finder, type) and issubclass(_finder, importlib.machinery.PathFinder):
            continue
        _find = getattr(_finder, "find_spec", None)
        _spec = _find("rollplan", None) if _find else None
        if _spec is not None:
            break
    if _spec is None:  # a regular install: search sys.path without this checkout's parent
        _parent = os.path.dirname(_here)
        _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _parent]
        _spec = importlib.machinery.PathFinder.find_spec("rollplan", _path)
    if _spec is None or _spec.origin is None or os.path.abspath(_spec.origin) == os.path.abspath(__file__):
        raise ImportError(
            f"'rollplan' resolved to the folder {_here}, a Rollplan checkout, not to the installed package. "
            f"Install it (pip install -e {_here}) or run your script from another directory."
        )
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["rollplan"] = _module  # the import system returns what sys.modules holds
    _spec.loader.exec_module(_module)
