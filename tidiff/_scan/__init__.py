"""``td.scan``: differentiable time loops with checkpointed reverse mode (see ``function``)."""
from .function import Scan, scan

__all__ = ["Scan", "scan"]
