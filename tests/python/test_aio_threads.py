"""zinf.aio from several Python threads: handles kept busy at once, one handle shared, GIL released."""

import os
import threading
import unittest

import zinf
from helpers import random_bytes, temp_dir


def run_threads(target, n):
    errors = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class ThreadTest(unittest.TestCase):
    def test_several_handles_busy_at_once(self):
        d = temp_dir(self)

        def work(i):
            with zinf.aio.Handle(block_size=65536, queue_depth=8, intra_op_parallelism=2) as h:
                path = os.path.join(d, f"t{i}.bin")
                for rnd in range(6):
                    pieces = [random_bytes(150000 + 4097 * j, i * 1000 + rnd * 10 + j) for j in range(4)]
                    offsets = [sum(len(p) for p in pieces[:j]) for j in range(4)]
                    for p, off in zip(pieces, offsets):
                        h.async_pwrite(bytearray(p), path, off)
                    assert h.wait() == 4
                    outs = [bytearray(len(p)) for p in pieces]
                    for o, off in zip(outs, offsets):
                        h.async_pread(o, path, off)
                    assert h.wait() == 4
                    assert [bytes(o) for o in outs] == pieces, f"thread {i} round {rnd}: data differs"

        run_threads(work, 6)

    def test_one_handle_shared_by_threads(self):
        d = temp_dir(self)
        h = zinf.aio.Handle(block_size=65536, queue_depth=8, intra_op_parallelism=2)
        self.addCleanup(h.close)

        def work(i):
            path = os.path.join(d, f"s{i}.bin")
            for rnd in range(10):
                data = random_bytes(100000 + rnd * 513, i * 100 + rnd)
                h.sync_pwrite(bytearray(data), path, rnd * 7, truncate=True)
                back = bytearray(len(data))
                h.sync_pread(back, path, rnd * 7)
                assert bytes(back) == data, f"thread {i} round {rnd}: data differs"

        run_threads(work, 6)
        self.assertEqual(h.pending(), 0)

    def test_gil_is_released_while_a_request_waits(self):
        # Opening a FIFO for reading blocks until a writer opens it. The writer is a Python
        # thread, so it can only get there if the reader released the GIL: held, this deadlocks.
        d = temp_dir(self)
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        h = zinf.aio.Handle(backend="threads", use_direct_io=False)
        self.addCleanup(h.close)
        outcome = []

        def reader():
            try:
                h.sync_pread(bytearray(16), fifo)
                outcome.append("read")
            except (zinf.AioError, ValueError) as e:
                outcome.append(e)

        t = threading.Thread(target=reader)
        t.start()
        fd = os.open(fifo, os.O_WRONLY)  # needs the GIL while the reader sits in open()
        os.write(fd, b"0123456789abcdef")
        os.close(fd)
        t.join()
        self.assertEqual(len(outcome), 1)  # a pipe has no offsets: an error or a read, never a hang


if __name__ == "__main__":
    unittest.main()
