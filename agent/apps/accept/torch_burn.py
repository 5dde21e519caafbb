"""The built-in load: a matrix-multiply burn on every CUDA GPU, run by `--load torch` as a child process.

`python -m agent.apps.accept.torch_burn --seconds N`. Exit 3 with one line on stderr when PyTorch is
missing or sees no CUDA device (the parent reports "load could not start: ..."). It only allocates
and multiplies: no GPU setting is read or changed. SIGTERM ends it between iterations.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any

EXIT_NO_LOAD = 3
MATRIX = 8192  # 8k x 8k half precision: ~0.4 GFLOP per element row, saturates tensor cores on H100/B200


def _burn(torch: Any, device: int, stop: threading.Event) -> None:
    with torch.cuda.device(device):
        a = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.float16)
        b = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.float16)
        while not stop.is_set():
            for _ in range(16):
                a = torch.matmul(a, b).clamp_(-1.0, 1.0)
            torch.cuda.synchronize()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent.apps.accept.torch_burn")
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        import torch  # type: ignore[import-not-found]  # the optional extra nodewarden[load]
    except ImportError as exc:
        print(f"PyTorch does not import: {exc}", file=sys.stderr)
        return EXIT_NO_LOAD
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("PyTorch sees no CUDA device", file=sys.stderr)
        return EXIT_NO_LOAD
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    workers = [threading.Thread(target=_burn, args=(torch, i, stop), daemon=True)
               for i in range(torch.cuda.device_count())]
    for worker in workers:
        worker.start()
    print(f"burning {len(workers)} GPU(s) for {args.seconds:g} s", file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.seconds
    while not stop.is_set() and time.monotonic() < deadline and all(w.is_alive() for w in workers):
        stop.wait(0.5)
    stop.set()
    for worker in workers:
        worker.join(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
