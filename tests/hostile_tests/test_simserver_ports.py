"""`simserver` on busy ports (class 8): exit 2 naming the port; the HTTP port defaults to the
one beside the gRPC port, so two servers started as the README shows do not collide."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .corpus import check, invoke

SIM = ["simserver", "--model", "llama-3-8b", "--gpu", "H100-SXM-80GB", "--max-batch", "8",
       "--host", "127.0.0.1"]  # fmt: skip


@contextmanager
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def free_pair() -> int:
    """A gRPC port whose neighbour below (the default HTTP port) is free too."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port - 1))
            except OSError:
                continue
            return port
    raise AssertionError("no free pair of ports")


def test_busy_grpc_port() -> None:
    with busy_port() as port:
        check(invoke([*SIM, "--port", str(port), "--http-port", "-1"]), 2,
              f"cannot bind the gRPC port 127.0.0.1:{port}")  # fmt: skip


def test_busy_http_port_stops_the_grpc_server_too() -> None:
    with busy_port() as http:
        result = invoke([*SIM, "--port", "0", "--http-port", str(http)])
        check(result, 2, f"cannot bind the HTTP port 127.0.0.1:{http}")
        assert "Exception ignored" not in result.output


def test_two_servers_with_default_http_ports_both_serve() -> None:
    procs = []
    try:
        for _ in range(2):
            port = free_pair()
            proc = subprocess.Popen(
                [sys.executable, "-m", "infertune_tuner.cli.simserver", *SIM[1:],
                 "--port", str(port), "--time-scale", "0.01"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert f"gRPC 127.0.0.1:{port}, HTTP 127.0.0.1:{port - 1}" in line, proc.stderr.read()
        assert all(p.poll() is None for p in procs)  # both still serving
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(10)
