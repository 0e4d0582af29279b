"""gpulint: find and fix GPU performance anti-patterns in PyTorch training code (never imports torch)."""

from gpulint.analysis import Confidence, Device, HotKind
from gpulint.diagnostics import Diagnostic, Edit, Fix, Position, Safety, Severity
from gpulint.rule import ImportRequest, Invalid, MicroCheck, Rule, Valid

__version__ = "0.1.0"

__all__ = [
    "Confidence", "Device", "Diagnostic", "Edit", "Fix", "HotKind", "ImportRequest", "Invalid", "MicroCheck",
    "Position", "Rule", "Safety", "Severity", "Valid", "__version__",
]
