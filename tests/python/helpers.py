"""Shared by the Python tests: temporary folders on the test disk, random bytes, backends."""

import os
import shutil
import tempfile
import unittest

import zinf


def temp_dir(case: unittest.TestCase) -> str:
    """A new folder under $ZINF_TEST_TMPDIR (the project disk, where O_DIRECT works), removed after the test."""
    base = os.environ.get("ZINF_TEST_TMPDIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix="zinf-py-", dir=base)
    case.addCleanup(shutil.rmtree, path, True)
    return path


def random_bytes(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


BACKENDS = zinf.aio.backends()
