"""Makes ``lm_eval --model lmlab`` work in a fresh process. lm-eval 0.4.x finds backends only in
its own table (``lm_eval.models``) or by ``@register_model`` in a module someone imported; it
reads no entry points. So a ``.pth`` file in site-packages (:func:`install`, run by
scripts/setup.sh: ``python -m lmlab.harness --install-hook``) imports this module at interpreter start;
it adds an import finder that, right after ``lm_eval.models`` runs, registers ``lmlab`` as a
lazy name (``lmlab.harness.adapter:LmlabLM``). Nothing heavy is imported at start-up (no torch,
no lm_eval); processes that never import lm_eval are untouched.
"""

from __future__ import annotations

import importlib.machinery
import sys

NAME, TARGET = "lmlab", "lmlab.harness.adapter:LmlabLM"
PTH_FILE = "lmlab-harness.pth"
PTH_LINE = ("import importlib.util as _u; _u.find_spec('lmlab') is not None and "
            "__import__('lmlab.harness.hook')\n")  # a no-op once lmlab is uninstalled


def register() -> None:
    """Add ``lmlab`` to the harness's model registry (lazily: the adapter loads on first use)."""
    from lm_eval.api.registry import model_registry

    if NAME not in model_registry:
        model_registry.register(NAME, target=TARGET)


class _RegisterAfter:
    """``lm_eval.models``'s own loader, then :func:`register` (importlib's loader protocol;
    no importlib.abc, which would slow every interpreter's start)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def create_module(self, spec: object) -> object:
        return self.inner.create_module(spec)

    def exec_module(self, module: object) -> None:
        self.inner.exec_module(module)
        register()

    def __getattr__(self, name: str) -> object:  # resources, source: the inner loader's
        return getattr(self.inner, name)


class _Finder:
    """A meta path finder (importlib's protocol) for ``lm_eval.models`` alone."""

    def find_spec(self, name: str, path: object, target: object = None) -> object:
        if name != "lm_eval.models":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfter(spec.loader)
        return spec


def activate() -> None:
    """Register now if lm_eval's backends are already loaded, else when they load."""
    if "lm_eval.models" in sys.modules:
        register()
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def install(site_packages: str | None = None) -> object:
    """Write the ``.pth`` file into this interpreter's site-packages (or ``site_packages``);
    returns its path."""
    import sysconfig
    from pathlib import Path

    folder = Path(site_packages or sysconfig.get_paths()["purelib"])
    path = folder / PTH_FILE
    path.write_text(PTH_LINE, encoding="utf-8")
    return path


activate()
