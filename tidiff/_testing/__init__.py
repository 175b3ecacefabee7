"""The code behind ``td.testing`` (the public module is ``tidiff/testing.py``).

- ``evidence``: comparisons and the failure message that shows the worst entry;
- ``problem``: a function and its arguments read once, outputs flattened,
  central differences, random directions;
- ``grads``: ``check_grads`` (forward vs reverse vs central differences);
- ``against_torch``: ``check_against_torch``;
- ``strategies``: hypothesis strategies for arguments and batch shapes.
"""
