"""zinf.aio misuse and failures: clear Python exceptions, never a crashed interpreter."""

import errno
import os
import pickle
import unittest

import zinf
from helpers import temp_dir

try:
    import numpy as np
except ImportError:
    np = None


class ErrorTest(unittest.TestCase):
    def setUp(self):
        self.dir = temp_dir(self)
        self.path = os.path.join(self.dir, "f.bin")
        with open(self.path, "wb") as f:
            f.write(b"\1" * 10000)
        self.h = zinf.aio.Handle()
        self.addCleanup(self.h.close)

    def test_read_past_the_end(self):
        with self.assertRaises(zinf.AioError) as cm:
            self.h.sync_pread(bytearray(20000), self.path, 0)
        e = cm.exception
        self.assertIsInstance(e, OSError)
        self.assertEqual((e.code, e.filename, e.offset, e.errno), ("OutOfRange", self.path, 0, None))
        self.assertIn(self.path, str(e))
        self.assertIn("10000", str(e))

    def test_failed_async_request_raises_from_wait_after_all_finish(self):
        good = bytearray(5000)
        self.h.async_pread(good, self.path, 0)
        self.h.async_pread(bytearray(8192), self.path, 8000)  # runs past the end
        self.h.async_pread(bytearray(100), self.path, 100)
        with self.assertRaises(zinf.AioError) as cm:
            self.h.wait()
        self.assertEqual((cm.exception.filename, cm.exception.offset, cm.exception.code),
                         (self.path, 8000, "OutOfRange"))
        self.assertEqual(self.h.pending(), 0)
        self.assertEqual(bytes(good), b"\1" * 5000)  # the good request before it completed
        self.assertEqual(self.h.wait(), 0)  # the handle goes on working

    def test_missing_file_and_directory(self):
        missing = os.path.join(self.dir, "nope.bin")
        with self.assertRaises(zinf.AioError) as cm:
            self.h.sync_pread(bytearray(10), missing)
        self.assertEqual((cm.exception.errno, cm.exception.filename), (errno.ENOENT, missing))
        with self.assertRaises(zinf.AioError) as cm:
            self.h.async_pread(bytearray(10), missing)  # errors at submission raise at once
        self.assertEqual(self.h.pending(), 0)
        with self.assertRaises(zinf.AioError) as cm:
            self.h.sync_pwrite(bytearray(10), self.dir)
        self.assertEqual(cm.exception.errno, errno.EISDIR)
        with self.assertRaises(zinf.AioError):
            self.h.sync_pwrite(bytearray(10), os.path.join(self.dir, "no", "such", "dir.bin"))

    def test_error_pickles(self):
        e = zinf.AioError(5, "pread /x offset 0 length 1: Input/output error", "/x", 0, "IoError")
        back = pickle.loads(pickle.dumps(e))
        self.assertEqual((back.errno, back.filename, back.offset, back.code, str(back)),
                         (5, "/x", 0, "IoError", str(e)))

    def test_bad_buffers(self):
        with self.assertRaisesRegex(TypeError, "read-only"):
            self.h.sync_pread(b"immutable", self.path)
        with self.assertRaisesRegex(TypeError, "expected an object exposing memory"):
            self.h.sync_pwrite(12345, self.path)
        with self.assertRaisesRegex(TypeError, "expected an object exposing memory"):
            self.h.async_pwrite("text", self.path)
        with self.assertRaisesRegex(ValueError, "buffer too small"):
            self.h.sync_pread(bytearray(10), self.path, nbytes=11)
        with self.assertRaisesRegex(ValueError, "nbytes must be >= 0"):
            self.h.sync_pread(bytearray(10), self.path, nbytes=-1)
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            self.h.sync_pwrite(memoryview(bytearray(100))[::2], self.path)
        self.assertEqual(self.h.pending(), 0)
        # bytes are fine to write from
        self.assertEqual(self.h.sync_pwrite(b"abc", self.path), 1)

    @unittest.skipIf(np is None, "numpy is not installed (Debian: python3-numpy)")
    def test_bad_numpy_arrays(self):
        a = np.zeros((100, 100), np.float32)
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            self.h.sync_pread(a[:, ::2], self.path)
        ro = np.zeros(10, np.uint8)
        ro.flags.writeable = False
        with self.assertRaisesRegex(TypeError, "read-only"):
            self.h.async_pread(ro, self.path)
        self.assertEqual(self.h.sync_pwrite(ro, self.path), 1)  # a read-only array can be written out

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "file_offset must be >= 0"):
            self.h.sync_pread(bytearray(10), self.path, -5)
        with self.assertRaisesRegex(ValueError, "empty path"):
            self.h.sync_pread(bytearray(10), "")
        with self.assertRaisesRegex(ValueError, "negative"):
            self.h.sync_pread(bytearray(10), -3)
        with self.assertRaises(TypeError):
            self.h.sync_pread(bytearray(10), 3.5)
        with self.assertRaises(zinf.AioError) as cm:
            self.h.sync_pread(bytearray(10), 987654)  # not an open descriptor
        self.assertEqual(cm.exception.errno, errno.EBADF)

    def test_bad_knobs(self):
        with self.assertRaisesRegex(ValueError, "block_size"):
            zinf.aio.Handle(block_size=100)
        with self.assertRaisesRegex(ValueError, "block_size"):
            zinf.aio.Handle(block_size=-4096)
        with self.assertRaisesRegex(ValueError, "queue_depth"):
            zinf.aio.Handle(queue_depth=0)
        with self.assertRaisesRegex(ValueError, "intra_op_parallelism"):
            zinf.aio.Handle(intra_op_parallelism=0)
        with self.assertRaisesRegex(ValueError, "backend"):
            zinf.aio.Handle(backend="carrier-pigeon")
        with self.assertRaises(TypeError):
            zinf.aio.Handle(block_size="big")

    @unittest.skipUnless(hasattr(os, "fork"), "needs fork()")
    def test_a_handle_is_refused_after_fork(self):
        pid = os.fork()
        if pid == 0:  # child: must get a clear error, not a hang
            code = 1
            try:
                self.h.sync_pread(bytearray(10), self.path)
            except RuntimeError as e:
                code = 0 if "fork" in str(e) else 2
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(self.h.sync_pread(bytearray(10), self.path), 1)  # the parent's still works


if __name__ == "__main__":
    unittest.main()
