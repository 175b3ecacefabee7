"""``td.torch``: tidiff Functions as PyTorch autograd operators (see ``td.torch.function``)."""
from ._torch import TorchFunction as TorchFunction
from ._torch import function as function

__all__ = ["TorchFunction", "function"]
