"""gpulint: find and fix GPU performance anti-patterns in PyTorch training code (never imports torch).

The public names are imported on first use: `gpulint --version` and `import gpulint` stay cheap (no libcst)."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Confidence": "gpulint.analysis", "Device": "gpulint.analysis", "HotKind": "gpulint.analysis",
    "Diagnostic": "gpulint.diagnostics", "Edit": "gpulint.diagnostics", "Fix": "gpulint.diagnostics",
    "Position": "gpulint.diagnostics", "Safety": "gpulint.diagnostics", "Severity": "gpulint.diagnostics",
    "DefinitionRequest": "gpulint.rule", "ImportRequest": "gpulint.rule", "Invalid": "gpulint.rule", "MicroCheck": "gpulint.rule", "Rule": "gpulint.rule",
    "Valid": "gpulint.rule",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpulint' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
