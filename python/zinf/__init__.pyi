import os
from typing import Any, Dict, Mapping, Optional, Union

from zinf import aio as aio
from zinf._errors import AioError as AioError

__version__: str

def save_file(tensors: Mapping[str, Any], path: Union[str, bytes, os.PathLike[str]],
              metadata: Optional[Mapping[str, str]] = ..., *, fsync: bool = ...) -> None: ...
def load_file(path: Union[str, bytes, os.PathLike[str]], framework: str = ..., *,
              out: Optional[Mapping[str, Any]] = ...) -> Dict[str, Any]: ...
