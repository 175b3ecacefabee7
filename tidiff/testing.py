"""Testing your derivatives: checkers and hypothesis strategies (``td.testing``).

- :func:`check_grads`: forward mode, reverse mode and central differences
  agree, to any order;
- :func:`check_against_torch`: every transform agrees with
  ``torch.autograd.functional``;
- :func:`arguments`, :func:`batch_shapes`: hypothesis strategies drawing
  valid arguments for a function's signature.

Failures raise ``AssertionError`` showing the worst entry: the check, the
argument and output, the index, both values and the errors. See
``docs/testing.md``.
"""
from ._testing.against_torch import check_against_torch as check_against_torch
from ._testing.grads import check_grads as check_grads
from ._testing.strategies import arguments as arguments
from ._testing.strategies import batch_shapes as batch_shapes

__all__ = ["arguments", "batch_shapes", "check_against_torch", "check_grads"]
