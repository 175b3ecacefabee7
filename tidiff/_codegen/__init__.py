"""Generated Taichi code: compiling source (``compile``), writing derivative bodies as ASTs
(``bodies``), and the kernels that launch a body over a batch (``batch``)."""
from .compile import compile_source as compile_source

__all__ = ["compile_source"]
