"""zinf.save_file / zinf.load_file: the safetensors layout byte for byte, round trips, bad files."""

import json
import os
import struct
import unittest

import zinf
import zinf._tensor_file as tf
from helpers import temp_dir

try:
    import numpy as np
except ImportError:
    np = None

try:
    import torch
except ImportError:
    torch = None


def independent_writer(path, tensors, order, pretty=False):
    """A plain safetensors writer, written from the format's description, not from zinf's code:
    tensors in the given order, optionally an indented header, then the data back to back."""
    header, blobs, at = {}, [], 0
    for name in order:
        a = tensors[name]
        dtype = {"float32": "F32", "float64": "F64", "int64": "I64", "int8": "I8", "uint8": "U8",
                 "float16": "F16", "int32": "I32", "bool": "BOOL", "int16": "I16", "uint16": "U16",
                 "uint32": "U32", "uint64": "U64"}[a.dtype.name]
        header[name] = {"shape": list(a.shape), "dtype": dtype, "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    text = json.dumps(header, indent=2 if pretty else None).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@unittest.skipIf(np is None, "numpy is not installed (Debian: python3-numpy)")
class TensorFileTest(unittest.TestCase):
    def setUp(self):
        self.dir = temp_dir(self)

    def small_staging(self):
        # Several staging buffers' worth of data without a big test: 8 KiB chunks.
        old = tf._STAGING
        tf._STAGING = 8192
        self.addCleanup(setattr, tf, "_STAGING", old)

    def test_known_bytes(self):
        # The format's own worked example: one F32 tensor "attn.0" of shape (1, 2, 3) holding 0..5.
        path = os.path.join(self.dir, "known.safetensors")
        zinf.save_file({"attn.0": np.arange(6, dtype=np.float32).reshape(1, 2, 3)}, path)
        head = b'{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}'
        self.assertEqual(len(head), 64)
        expected = struct.pack("<Q", 64) + head + np.arange(6, dtype="<f4").tobytes()
        with open(path, "rb") as f:
            self.assertEqual(f.read(), expected)
        # Empty file with metadata: header padded with spaces to 8 bytes.
        zinf.save_file({}, path, {"framework": "pt"})
        with open(path, "rb") as f:
            self.assertEqual(f.read(), struct.pack("<Q", 40) + b'{"__metadata__":{"framework":"pt"}}' + b" " * 5)

    def test_order_is_dtype_rank_then_name(self):
        path = os.path.join(self.dir, "order.safetensors")
        t = {"b": np.zeros(3, np.uint8), "a": np.zeros(2, np.uint8), "z": np.zeros(1, np.float64),
             "c": np.zeros(1, np.float32), "d": np.zeros(1, np.int64)}
        zinf.save_file(t, path)
        _, entries, _ = tf.read_header(path)
        self.assertEqual(list(entries), ["d", "z", "c", "a", "b"])

    def test_round_trip_dtypes_shapes_and_sizes(self):
        self.small_staging()
        rng = np.random.default_rng(1)
        tensors = {
            "f32": rng.standard_normal((37, 129)).astype(np.float32),
            "f64": rng.standard_normal(1001),
            "f16": rng.standard_normal((3, 5, 7)).astype(np.float16),
            "i64": rng.integers(-2**62, 2**62, (50,), dtype=np.int64),
            "i32": rng.integers(-2**31, 2**31 - 1, (9, 9), dtype=np.int32),
            "i16": rng.integers(-2**15, 2**15 - 1, 77, dtype=np.int16),
            "u16": rng.integers(0, 2**16 - 1, 78, dtype=np.uint16),
            "u32": rng.integers(0, 2**32 - 1, 79, dtype=np.uint32),
            "u64": rng.integers(0, 2**63, 80, dtype=np.uint64),
            "i8": rng.integers(-128, 127, 3333, dtype=np.int8),
            "u8": rng.integers(0, 255, 100003, dtype=np.uint8),
            "bool": rng.integers(0, 2, 17).astype(bool),
            "scalar": np.array(3.5, np.float32),
            "empty": np.zeros((0, 4), np.float32),
            "big": rng.standard_normal(300000).astype(np.float32),
        }
        for fsync in (False, True):
            path = os.path.join(self.dir, f"rt{fsync}.safetensors")
            zinf.save_file(tensors, path, {"step": "7", "who": "test"}, fsync=fsync)
            back = zinf.load_file(path)
            self.assertEqual(set(back), set(tensors))
            for k, v in tensors.items():
                self.assertEqual((back[k].dtype, back[k].shape), (v.dtype, v.shape), k)
                np.testing.assert_array_equal(back[k], v, err_msg=k)
            self.assertEqual(tf.read_header(path)[2], {"step": "7", "who": "test"})
            back["f32"][0, 0] = 1.0  # writable

    def test_reads_files_from_an_independent_writer(self):
        rng = np.random.default_rng(2)
        t = {"w": rng.standard_normal((64, 33)).astype(np.float32), "b": np.arange(5, dtype=np.int64),
             "m": np.array([True, False])}
        for pretty, order in ((False, ["b", "m", "w"]), (True, ["w", "b", "m"])):
            path = os.path.join(self.dir, f"ind{pretty}.safetensors")
            independent_writer(path, t, order, pretty)
            back = zinf.load_file(path)
            self.assertEqual(list(back), order)
            for k in t:
                np.testing.assert_array_equal(back[k], t[k])

    def test_many_sizes_through_staging(self):
        self.small_staging()
        for n in (0, 1, 8191, 8192, 8193, 3 * 8192 + 5, 100000):
            with self.subTest(n=n):
                path = os.path.join(self.dir, f"s{n}.safetensors")
                a = np.arange(n, dtype=np.uint8)
                zinf.save_file({"a": a}, path)
                np.testing.assert_array_equal(zinf.load_file(path)["a"], a)
                self.assertEqual(os.path.getsize(path), 8 + tf.read_header(path)[0] - 8 + n)

    def test_threads_save_and_load_at_once(self):
        import threading

        self.small_staging()
        errors = []

        def work(i):
            try:
                rng = np.random.default_rng(i)
                t = {f"t{j}": rng.standard_normal(1000 + 777 * j).astype(np.float32) for j in range(5)}
                path = os.path.join(self.dir, f"thread{i}.safetensors")
                for _ in range(3):
                    zinf.save_file(t, path)
                    back = zinf.load_file(path)
                    for k in t:
                        np.testing.assert_array_equal(back[k], t[k])
            except BaseException as e:  # re-raised in the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]

    def test_load_into_existing_arrays(self):
        self.small_staging()
        rng = np.random.default_rng(4)
        t = {"w": rng.standard_normal((40, 50)).astype(np.float32), "i": np.arange(7, dtype=np.int64),
             "e": np.zeros((0,), np.float32)}
        path = os.path.join(self.dir, "into.safetensors")
        zinf.save_file(t, path)
        out = {k: np.zeros_like(v) for k, v in t.items()}
        ids = {k: id(v) for k, v in out.items()}
        back = zinf.load_file(path, out=out)
        self.assertEqual({k: id(v) for k, v in back.items()}, ids)  # filled in place
        for k in t:
            np.testing.assert_array_equal(out[k], t[k])
        with self.assertRaisesRegex(ValueError, "missing"):
            zinf.load_file(path, out={"w": out["w"], "i": out["i"]})
        with self.assertRaisesRegex(ValueError, "not in the file"):
            zinf.load_file(path, out=dict(out, x=np.zeros(1)))
        with self.assertRaisesRegex(ValueError, "in the file"):
            zinf.load_file(path, out=dict(out, w=np.zeros((50, 40), np.float32)))
        with self.assertRaisesRegex(ValueError, "in the file"):
            zinf.load_file(path, out=dict(out, i=np.zeros(7, np.int32)))
        ro = np.zeros(7, np.int64)
        ro.flags.writeable = False
        with self.assertRaisesRegex(TypeError, "read-only"):
            zinf.load_file(path, out=dict(out, i=ro))

    def test_save_errors(self):
        path = os.path.join(self.dir, "bad.safetensors")
        with self.assertRaisesRegex(ValueError, "not C-contiguous"):
            zinf.save_file({"a": np.zeros((4, 4), np.float32)[:, ::2]}, path)
        with self.assertRaisesRegex(ValueError, "not C-contiguous"):
            zinf.save_file({"a": np.asfortranarray(np.zeros((4, 4), np.float32))}, path)
        with self.assertRaisesRegex(TypeError, "complex64"):
            zinf.save_file({"a": np.zeros(3, np.complex64)}, path)
        with self.assertRaisesRegex(ValueError, "big-endian"):
            zinf.save_file({"a": np.zeros(3, ">f4")}, path)
        with self.assertRaisesRegex(ValueError, "reserved"):
            zinf.save_file({"__metadata__": np.zeros(3)}, path)
        with self.assertRaisesRegex(TypeError, "not a numpy array"):
            zinf.save_file({"a": [1, 2, 3]}, path)
        with self.assertRaisesRegex(TypeError, "str to str"):
            zinf.save_file({"a": np.zeros(3)}, path, {"k": 1})
        with self.assertRaises(zinf.AioError):
            zinf.save_file({"a": np.zeros(3)}, os.path.join(self.dir, "no", "dir", "x.safetensors"))

    def test_save_replaces_the_file_whole(self):
        # The bytes go to a temporary file beside the path, renamed over it when complete: the
        # old file's permission bits stay, nothing is left beside it, and a link is followed.
        path = os.path.join(self.dir, "m.safetensors")
        zinf.save_file({"a": np.zeros(1000, np.float32)}, path)
        os.chmod(path, 0o600)
        new = {"b": np.arange(5000, dtype=np.float32)}
        zinf.save_file(new, path, fsync=True)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        np.testing.assert_array_equal(zinf.load_file(path)["b"], new["b"])
        self.assertEqual(sorted(os.listdir(self.dir)), ["m.safetensors"])
        link = os.path.join(self.dir, "link.safetensors")
        os.symlink("m.safetensors", link)
        zinf.save_file({"c": np.ones(7, np.float32)}, link)
        self.assertTrue(os.path.islink(link))
        self.assertEqual(list(zinf.load_file(path)), ["c"])
        self.assertEqual(sorted(os.listdir(self.dir)), ["link.safetensors", "m.safetensors"])

    def test_failed_save_leaves_the_path_as_it_was(self):
        # A failure after the bytes are written (here: the path is a folder, so the rename fails)
        # leaves the path untouched and no temporary file behind.
        folder = os.path.join(self.dir, "a_folder")
        os.mkdir(folder)
        with open(os.path.join(folder, "inside"), "w") as f:
            f.write("kept")
        with self.assertRaisesRegex(zinf.AioError, "rename"):
            zinf.save_file({"a": np.zeros(3000, np.float32)}, folder)
        self.assertEqual(os.listdir(folder), ["inside"])
        self.assertEqual(sorted(os.listdir(self.dir)), ["a_folder"])

    def test_load_errors(self):
        path = os.path.join(self.dir, "x.safetensors")
        zinf.save_file({"a": np.arange(10, dtype=np.float32)}, path)
        with open(path, "rb") as f:
            good = f.read()

        def check(data, pattern):
            with open(path, "wb") as f:
                f.write(data)
            with self.assertRaisesRegex(ValueError, pattern):
                zinf.load_file(path)

        check(good[:-1], "end at byte")  # truncated data
        check(good + b"x", "end at byte")  # trailing bytes
        check(good[:5], "shorter than")
        check(struct.pack("<Q", 1 << 40) + good[8:], "header length")
        check(struct.pack("<Q", 8) + b"{notjson" + good[16:], "not JSON")
        check(struct.pack("<Q", 2) + b"[]", "not a JSON object")
        h = b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}'
        check(struct.pack("<Q", len(h)) + h + bytes(8), "8 bytes for shape")
        h = b'{"a":{"dtype":"Q99","shape":[1],"data_offsets":[0,4]}}'
        check(struct.pack("<Q", len(h)) + h + bytes(4), "unknown dtype")
        h = b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}'
        check(struct.pack("<Q", len(h)) + h + bytes(3), "starts at 1")
        with self.assertRaises(FileNotFoundError):
            zinf.load_file(os.path.join(self.dir, "missing.safetensors"))
        with self.assertRaisesRegex(ValueError, "framework"):
            zinf.load_file(path, framework="jax")

    def test_bf16_needs_torch_for_loading(self):
        path = os.path.join(self.dir, "bf16.safetensors")
        h = b'{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}'
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"\x80\x3f\x00\x40")
        with self.assertRaisesRegex(TypeError, "framework='pt'"):
            zinf.load_file(path)

    @unittest.skipIf(torch is None, "PyTorch is not installed (not a test dependency)")
    def test_torch_round_trip(self):
        path = os.path.join(self.dir, "pt.safetensors")
        t = {"w": torch.randn(33, 65), "h": torch.randn(7).to(torch.bfloat16), "i": torch.arange(9)}
        zinf.save_file(t, path)
        back = zinf.load_file(path, framework="pt")
        for k in t:
            self.assertTrue(torch.equal(back[k], t[k]), k)


if __name__ == "__main__":
    unittest.main()
