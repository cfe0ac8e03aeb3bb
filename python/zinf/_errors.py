"""The exception zinf.aio raises for a failed read or write."""

from __future__ import annotations

from typing import Optional


class AioError(OSError):
    """A read or write of zinf.aio failed, or a file could not be opened.

    Attributes:
        errno: the system error number, or None when the failure has none (a read past the
            end of the file, a request that ran past ``request_timeout_s``).
        filename: the path (or ``"fd:N"``) of the failed request.
        offset: the file offset at which the failed request started.
        code: zinf's name for the failure: ``"IoError"``, ``"OutOfRange"`` (read past the
            end), ``"NotFound"``, ``"Unsupported"``, ``"Aborted"``, ``"Corruption"``...

    ``str(error)`` is zinf's full message: the operation, path, offset and length of the
    failing chunk and the errno text.
    """

    def __init__(self, errno: Optional[int], message: str, filename: Optional[str] = None,
                 offset: Optional[int] = None, code: str = "IoError") -> None:
        super().__init__(errno, message)
        self.filename = filename
        self.offset = offset
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # picklable across processes (multiprocessing pools)
        return (type(self), (self.errno, self.message, self.filename, self.offset, self.code))
