"""Generated Taichi code: derivative bodies written as ASTs (``bodies``, ``blocks``, ``nested``) and the
kernels that launch a body over a batch (``batch``)."""
