"""zinf from Python: the asynchronous I/O engine (zinf.aio) and fast safetensors files.

    import zinf
    h = zinf.aio.Handle(block_size=1 << 20, queue_depth=8)
    zinf.save_file({"w": array}, "model.safetensors")
    tensors = zinf.load_file("model.safetensors")           # numpy arrays
    tensors = zinf.load_file("model.safetensors", framework="pt")  # torch tensors

See docs/python.md.
"""

from zinf import aio
from zinf._errors import AioError
from zinf._tensor_file import load_file, save_file

__version__ = "0.1.0"
__all__ = ["aio", "AioError", "load_file", "save_file", "__version__"]
