"""zinf.aio round trips: sizes, offsets, backends, O_DIRECT on and off, buffer kinds, async order."""

import gc
import os
import sys
import unittest

import zinf
from helpers import BACKENDS, random_bytes, temp_dir

try:
    import numpy as np
except ImportError:  # numpy is optional for the package; these tests skip without it
    np = None

SIZES = [0, 1, 511, 4096, 4097, 65536 + 3, 1 << 20, (3 << 20) + 123]
OFFSETS = [0, 1, 4096, 12345]


class RoundTripTest(unittest.TestCase):
    def test_sizes_offsets_backends_and_modes(self):
        d = temp_dir(self)
        for backend in BACKENDS:
            for direct in (True, False):
                h = zinf.aio.Handle(block_size=65536, queue_depth=4, intra_op_parallelism=2, backend=backend,
                                    use_direct_io=direct)
                self.assertEqual(h.backend, backend)
                for size in SIZES:
                    for offset in OFFSETS:
                        with self.subTest(backend=backend, direct=direct, size=size, offset=offset):
                            path = os.path.join(d, f"{backend}-{direct}-{size}-{offset}.bin")
                            data = random_bytes(size, size * 31 + offset)
                            self.assertEqual(h.sync_pwrite(bytearray(data), path, offset), 1)
                            with open(path, "rb") as f:
                                f.seek(offset)
                                self.assertEqual(f.read(), data)
                            back = bytearray(size)
                            self.assertEqual(h.sync_pread(back, path, offset), 1)
                            self.assertEqual(bytes(back), data)
                h.close()

    def test_deepnvme_verbs_and_return_values(self):
        d = temp_dir(self)
        path = os.path.join(d, "f.bin")
        h = zinf.aio.Handle(1 << 20, 8, False, True, 1)  # DeepNVMe's positional order
        self.assertEqual((h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
                          h.get_intra_op_parallelism()), (1 << 20, 8, False, True, 1))
        self.assertEqual(h.get_alignment(), 4096)
        data = random_bytes(300000, 1)
        self.assertEqual(h.write(bytearray(data), path, True), 1)  # validate=True reads back
        out = bytearray(len(data))
        self.assertEqual(h.read(out, path, True), 1)
        self.assertEqual(out, data)
        self.assertEqual(h.pwrite(bytearray(data), path, False, True, 4096), 0)  # async: 0 now
        self.assertEqual(h.wait(), 1)
        out = bytearray(len(data))
        self.assertEqual(h.pread(out, path, False, False, 4096), 1)
        self.assertEqual(out, data)
        self.assertEqual(h.pread(out, path, **{"validate": True, "async": True, "file_offset": 4096}), 0)
        self.assertEqual(h.wait(), 1)
        self.assertEqual(h.wait(), 0)  # nothing queued

    def test_async_many_then_wait_counts_and_orders(self):
        d = temp_dir(self)
        path = os.path.join(d, "many.bin")
        h = zinf.aio.Handle(block_size=8192, queue_depth=4, intra_op_parallelism=2)
        piece = 10000
        chunks = [random_bytes(piece, i) for i in range(40)]
        for i, c in enumerate(chunks):
            self.assertEqual(h.async_pwrite(bytearray(c), path, i * piece), 0)
        self.assertEqual(h.pending(), 40)
        self.assertEqual(h.wait(), 40)
        self.assertEqual(h.pending(), 0)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"".join(chunks))
        outs = [bytearray(piece) for _ in chunks]
        for i, o in enumerate(outs):
            h.async_pread(o, path, i * piece)
        self.assertEqual(h.wait(), 40)
        self.assertEqual([bytes(o) for o in outs], chunks)
        # A write, waited for, then a read of the same range sees it (requests finish in wait order).
        h.async_pwrite(bytearray(b"x" * piece), path, 0)
        h.wait()
        o = bytearray(piece)
        h.async_pread(o, path, 0)
        h.wait()
        self.assertEqual(bytes(o), b"x" * piece)

    def test_file_descriptor_targets(self):
        d = temp_dir(self)
        path = os.path.join(d, "fd.bin")
        h = zinf.aio.Handle()
        data = random_bytes(70000, 7)
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0)):
            fd = os.open(path, flags, 0o644)
            try:
                h.sync_pwrite(bytearray(data), fd, 100)  # unaligned offset and length on an O_DIRECT fd
                h.async_pwrite(bytearray(data), fd, 100 + len(data))
                self.assertEqual(h.wait(), 1)
                back = bytearray(2 * len(data))
                h.sync_pread(back, fd, 100)
                self.assertEqual(bytes(back), data + data)
            finally:
                os.close(fd)

    def test_path_like_and_bytes_paths(self):
        import pathlib

        d = temp_dir(self)
        h = zinf.aio.Handle()
        data = bytearray(random_bytes(5000, 3))
        h.sync_pwrite(data, pathlib.Path(d) / "p.bin")
        back = bytearray(5000)
        h.sync_pread(back, os.fsencode(os.path.join(d, "p.bin")))
        self.assertEqual(back, data)

    def test_nbytes_and_truncate(self):
        d = temp_dir(self)
        path = os.path.join(d, "n.bin")
        h = zinf.aio.Handle()
        h.sync_pwrite(bytearray(b"a" * 10000), path)
        h.sync_pwrite(bytearray(b"b" * 10000), path, nbytes=100, truncate=True)
        self.assertEqual(os.path.getsize(path), 100)
        back = bytearray(1000)
        h.sync_pread(back, path, nbytes=100)
        self.assertEqual(bytes(back[:100]), b"b" * 100)
        self.assertEqual(bytes(back[100:]), bytes(900))

    def test_memoryview_slices_share_memory(self):
        d = temp_dir(self)
        path = os.path.join(d, "mv.bin")
        h = zinf.aio.Handle()
        h.sync_pwrite(bytearray(random_bytes(8192, 9)), path)
        big = bytearray(10000)
        h.sync_pread(memoryview(big)[100:4196], path, 4096)
        with open(path, "rb") as f:
            f.seek(4096)
            self.assertEqual(bytes(big[100:4196]), f.read(4096))
        self.assertEqual(bytes(big[:100]), bytes(100))

    def test_buffer_held_until_wait(self):
        d = temp_dir(self)
        path = os.path.join(d, "held.bin")
        h = zinf.aio.Handle()
        h.sync_pwrite(bytearray(random_bytes(1 << 20, 11)), path)
        buf = bytearray(1 << 20)
        before = sys.getrefcount(buf)
        h.async_pread(buf, path)
        self.assertGreater(sys.getrefcount(buf), before)  # the export holds the object
        with self.assertRaises(BufferError):
            buf.extend(b"x")  # a bytearray in flight cannot be resized
        view_id = id(buf)
        del buf
        gc.collect()
        self.assertEqual(h.wait(), 1)  # the memory was still there for the read
        self.assertNotEqual(view_id, 0)

    def test_close_and_context_manager(self):
        d = temp_dir(self)
        path = os.path.join(d, "c.bin")
        with zinf.aio.Handle() as h:
            h.async_pwrite(bytearray(b"z" * 5000), path)
        self.assertTrue(h.closed)  # __exit__ finished the queued write
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"z" * 5000)
        with self.assertRaisesRegex(ValueError, "closed"):
            h.sync_pread(bytearray(10), path)
        h.close()  # twice is fine
        self.assertIn("closed", repr(h))

    def test_garbage_collected_handle_finishes_its_requests(self):
        d = temp_dir(self)
        path = os.path.join(d, "gc.bin")
        h = zinf.aio.Handle()
        h.async_pwrite(bytearray(b"q" * 70000), path)
        del h
        gc.collect()
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"q" * 70000)


@unittest.skipIf(np is None, "numpy is not installed (Debian: python3-numpy)")
class NumpyAndPinnedTest(unittest.TestCase):
    def test_numpy_arrays_in_place(self):
        d = temp_dir(self)
        path = os.path.join(d, "np.bin")
        h = zinf.aio.Handle(intra_op_parallelism=2)
        a = np.random.default_rng(0).standard_normal((300, 257)).astype(np.float32)
        h.sync_pwrite(a, path, 8)
        b = np.empty_like(a)
        h.sync_pread(b, path, 8)
        np.testing.assert_array_equal(a, b)
        f = np.asfortranarray(a)  # contiguous in Fortran order: its bytes as they lie
        h.sync_pwrite(f, path)
        g = np.empty_like(f)
        h.sync_pread(g, path)
        np.testing.assert_array_equal(f, g)

    def test_pinned_buffers(self):
        p = zinf.aio.pinned(1 << 20)
        self.assertEqual((p.nbytes, len(p), p.alignment, p.address % 4096), (1 << 20, 1 << 20, 4096, 0))
        self.assertEqual(bytes(memoryview(p)[:16]), bytes(16))  # zero-filled
        self.assertEqual(zinf.aio.pinned(0).nbytes, 0)
        self.assertEqual(zinf.aio.pinned(100, alignment=1 << 16).address % (1 << 16), 0)
        arr = zinf.aio.pinned_array((64, 1024), "float32")
        self.assertEqual((arr.shape, arr.dtype, arr.ctypes.data % 4096), ((64, 1024), np.float32, 0))
        with self.assertRaises(ValueError):
            zinf.aio.pinned(-1)
        with self.assertRaises(ValueError):
            zinf.aio.pinned(10, alignment=3)
        with self.assertRaises(ValueError):
            zinf.aio.pinned_array((2, -1))

    def test_pinned_registered_round_trip_uses_fixed_buffers(self):
        d = temp_dir(self)
        path = os.path.join(d, "pin.bin")
        h = zinf.aio.Handle(block_size=1 << 18, queue_depth=8, intra_op_parallelism=2)
        src = zinf.aio.pinned_array(4 << 20, "uint8")
        src[:] = np.frombuffer(random_bytes(4 << 20, 5), np.uint8)
        dst = zinf.aio.pinned_array(4 << 20, "uint8")
        h.register_buffer(src)
        h.register_buffer(dst)
        h.async_pwrite(src, path)
        h.wait()
        h.async_pread(dst, path)
        h.wait()
        np.testing.assert_array_equal(src, dst)
        stats = h.stats()
        self.assertEqual(stats["bounced_bytes"], 0)
        if h.backend == "io_uring":
            self.assertGreater(stats["fixed_ops"], 0)
        h.unregister_buffers()

    def test_torch_like_objects_are_duck_typed(self):
        # A stand-in with torch.Tensor's memory accessors (torch itself is not a test dependency).
        class FakeTensor:
            def __init__(self, arr, device="cpu", contiguous=True):
                self.arr, self._contig = arr, contiguous
                self.device = type("Device", (), {"type": device, "__str__": lambda s: device})()

            def data_ptr(self):
                return self.arr.ctypes.data

            def numel(self):
                return self.arr.size

            def element_size(self):
                return self.arr.itemsize

            def is_contiguous(self):
                return self._contig

        d = temp_dir(self)
        path = os.path.join(d, "t.bin")
        h = zinf.aio.Handle()
        a = np.arange(10000, dtype=np.float32)
        h.sync_pwrite(FakeTensor(a), path)
        b = np.zeros_like(a)
        h.async_pread(FakeTensor(b), path)
        h.wait()
        np.testing.assert_array_equal(a, b)
        with self.assertRaisesRegex(ValueError, "cuda:0"):
            h.sync_pread(FakeTensor(b, device="cuda:0"), path)
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            h.sync_pread(FakeTensor(b, contiguous=False), path)


if __name__ == "__main__":
    unittest.main()
