"""Random concurrent I/O through libnbd, checked against a byte model.

Requests are unaligned (1 byte to 192 KiB, anywhere in a small window, so
neighbours often share a block), up to 16 in flight, and never overlap a
request still in flight: NBD leaves the order of overlapping requests to
the server, but two writes to different bytes of one block must both
land. Every read is compared with the model as it stood when the read
was sent. Bytes under a TRIM read as anything until written again.
"""

import random

import nbd

IN_FLIGHT_MAX = 16
LENGTH_MAX = 192 * 1024


class Model:
    def __init__(self, size, window):
        self.size = size
        self.window = window
        self.data = bytearray(size)  # what the export must hold
        self.known = bytearray(b"\x01") * size  # 0 where a TRIM left it open

    def apply(self, kind, offset, payload, length):
        end = offset + length
        if kind == "write":
            self.data[offset:end] = payload
            self.known[offset:end] = b"\x01" * length
        elif kind == "zero":
            self.data[offset:end] = bytes(length)
            self.known[offset:end] = b"\x01" * length
        elif kind == "trim":
            self.known[offset:end] = bytes(length)

    def mismatch(self, offset, got, chunk=64 * 1024):
        """The first offset where `got` contradicts the model, or None."""
        for at in range(0, len(got), chunk):
            g = got[at:at + chunk]
            w = self.data[offset + at:offset + at + len(g)]
            if g == w:
                continue
            k = self.known[offset + at:offset + at + len(g)]
            for i, (gb, wb, kb) in enumerate(zip(g, w, k)):
                if kb and gb != wb:
                    return offset + at + i
        return None


def read_all(h, offset, length, step=4 << 20):
    out = bytearray()
    while length > 0:
        take = min(step, length)
        out += h.pread(take, offset)
        offset += take
        length -= take
    return bytes(out)


def run_random_io(handles, model, ops, seed):
    """Issue `ops` random requests, each on a random one of `handles` (one
    libnbd handle, or several connections to the same export); returns
    the counts by kind. Raises AssertionError on the first read that
    contradicts the model."""
    if not isinstance(handles, (list, tuple)):
        handles = [handles]
    rng = random.Random(seed)
    base = rng.randrange(0, model.size - model.window + 1, 4096) + rng.randrange(4096)
    base = min(base, model.size - model.window)
    in_flight = {}  # (handle index, cookie) -> (kind, offset, length, buffer)
    counts = {}

    def busy(offset, length):
        return any(o < offset + length and offset < o + n for (_, o, n, _) in in_flight.values())

    def shares_a_block(offset, length):
        first, last = offset // 4096, (offset + length - 1) // 4096
        return any(o // 4096 <= last and first <= (o + n - 1) // 4096
                   for (k, o, n, _) in in_flight.values() if n and k != "read")

    def retire(index, cookie):
        kind, offset, length, buf = in_flight.pop((index, cookie))
        handles[index].aio_command_completed(cookie)  # raises on a server error
        if kind == "read":
            got = buf.to_bytearray()
            bad = model.mismatch(offset, got)
            assert bad is None, (
                f"read [{offset}, {offset + length}) differs from the model at byte {bad} "
                f"(seed {seed})")

    issued = 0
    while issued < ops or in_flight:
        if issued < ops and len(in_flight) < IN_FLIGHT_MAX:
            kind = rng.choices(["read", "write", "zero", "trim", "flush"], [40, 40, 8, 6, 2])[0]
            length = rng.choice([1, 511, 512, 4095, 4096, 4097, rng.randrange(1, LENGTH_MAX)])
            offset = base + rng.randrange(0, model.window - length + 1)
            if in_flight and rng.random() < 0.3:
                # Right beside a request in flight, within the same block.
                _, o, n, _ = rng.choice(list(in_flight.values()))
                gap = rng.randrange(0, 64)
                offset = o + n + gap if rng.random() < 0.5 else o - gap - length
                offset = min(max(offset, base), base + model.window - length)
            if kind != "flush" and busy(offset, length):
                kind = "flush" if rng.random() < 0.1 else None
            if kind is not None:
                index = rng.randrange(len(handles))
                h = handles[index]
                flags = nbd.CMD_FLAG_FUA if kind in ("write", "zero", "trim") and rng.random() < 0.2 else 0
                if kind in ("write", "zero", "trim") and shares_a_block(offset, length):
                    counts["block shared with a write in flight"] = (
                        counts.get("block shared with a write in flight", 0) + 1)
                if kind == "read":
                    buf = nbd.Buffer(length)
                    cookie = h.aio_pread(buf, offset)
                    # The model as of now is what the read must see: nothing
                    # overlapping it is in flight, and nothing may be sent over it
                    # until it is answered.
                elif kind == "write":
                    payload = rng.randbytes(length)
                    buf = nbd.Buffer.from_bytearray(bytearray(payload))
                    cookie = h.aio_pwrite(buf, offset, flags=flags)
                    model.apply("write", offset, payload, length)
                elif kind == "zero":
                    buf = None
                    if rng.random() < 0.5:
                        flags |= nbd.CMD_FLAG_NO_HOLE
                    cookie = h.aio_zero(length, offset, flags=flags)
                    model.apply("zero", offset, None, length)
                elif kind == "trim":
                    buf = None
                    cookie = h.aio_trim(length, offset, flags=flags)
                    model.apply("trim", offset, None, length)
                else:
                    buf, offset, length = None, 0, 0
                    cookie = h.aio_flush()
                in_flight[(index, cookie)] = (kind, offset, length, buf)
                counts[kind] = counts.get(kind, 0) + 1
                issued += 1
                continue
        # Full, or the next request would overlap one in flight: wait for one.
        retire(*wait_for_any(handles, {index for index, _ in in_flight}))
    return counts


def wait_for_any(handles, busy):
    """(index, cookie) of a completed command on one of the `busy` handles."""
    while True:
        for index in busy:
            cookie = handles[index].aio_peek_command_completed()
            if cookie > 0:
                return index, cookie
        for index in busy:
            # A short timeout each, so that no connection waits on another.
            handles[index].poll(1 if len(busy) > 1 else -1)


def check_whole(h, model, where):
    got = read_all(h, 0, model.size)
    bad = model.mismatch(0, got)
    assert bad is None, f"{where}: the export differs from the model at byte {bad}"
