#!/usr/bin/env python3
"""Write a 256-byte IPMI FRU image (common header + board + product area) to argv[1].

Adapted from the project recipe /work/shared/peers/ipmi/mkfru.py (shared/peers/README.md section 3b).
The names are those of a GPU server; tests/integration/test_ipmi.py expects them (see FRU_* in tests/peers/ipmi_sim.py).
"""

import sys

BOARD = ("Acme Compute", "G8X-MB", "BRD0001", "PN-G8X-MB-01")  # manufacturer, name, serial, part
PRODUCT = ("Acme Compute", "G8X-H100 GPU Server", "G8X-H100", "1.0", "SN0000001", "ASSET-1")


def tl(s: str) -> bytes:
    """Type/length byte (8-bit ASCII) + the text."""
    b = s.encode("ascii")
    assert len(b) < 64
    return bytes([0xC0 | len(b)]) + b


def area(body: bytes) -> bytes:
    """End marker, pad to a multiple of 8 bytes including the checksum, fix the length byte."""
    out = bytearray(body) + b"\xc1"
    while (len(out) + 1) % 8:
        out.append(0)
    out[1] = (len(out) + 1) // 8
    out.append((-sum(out)) & 0xFF)
    return bytes(out)


def image() -> bytes:
    board = area(b"\x01\x00\x00" + b"\x00\x00\x00" + b"".join(tl(s) for s in BOARD) + tl(""))
    product = area(b"\x01\x00\x00" + b"".join(tl(s) for s in PRODUCT) + tl(""))
    header = bytearray([0x01, 0, 0, 1, 1 + len(board) // 8, 0, 0])
    header.append((-sum(header)) & 0xFF)
    img = bytes(header) + board + product
    return img + b"\x00" * (256 - len(img))


if __name__ == "__main__":
    with open(sys.argv[1], "wb") as f:
        f.write(image())
