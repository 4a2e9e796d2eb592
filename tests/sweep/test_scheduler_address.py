"""A --scheduler address where something that is not a Dask scheduler
answers (an HTTP server, a service that accepts and says nothing, one that
sends garbage) is one ConfigError naming the address within the connection
timeout, before any file is written."""
from __future__ import annotations

import socketserver
import threading
import time

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from sweep_fakes import TINY

GRID = {"dp": [1, 2]}
#: garbage as a Dask peer would read it: frame counts and lengths of 2**64 - 1
GARBAGE = b"\xff" * 64
HTTP = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nBad Request"


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _serve(reply: bytes):
    """A TCP server on a free local port that sends ``reply`` to each
    client and keeps the connection open until it is shut down."""
    stop = threading.Event()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            try:
                if reply:
                    self.request.sendall(reply)
                while not stop.wait(0.05):
                    pass
            except OSError:
                pass

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, stop


@pytest.mark.parametrize("reply", [GARBAGE, HTTP, b""], ids=["garbage", "http", "silent"])
def test_a_server_that_is_not_dask_is_one_config_error(tmp_path, reply):
    pytest.importorskip("distributed")
    server, stop = _serve(reply)
    address = f"tcp://127.0.0.1:{server.server_address[1]}"
    out = tmp_path / "out"
    try:
        start = time.monotonic()
        with pytest.raises(ConfigError) as info:
            distsim.sweep(TINY, GRID, scheduler=address, out_dir=out, progress=False,
                          connect_timeout_s=1)
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert message.startswith(f"--scheduler {address}: ") and "\n" not in message
    assert "within 1 s" in message
    assert elapsed < 1 + 2 + 5          # the timeout, the grace, slack for a loaded machine
    assert not out.exists()


def test_the_cli_reports_it_in_one_line(tmp_path, capsys):
    pytest.importorskip("distributed")
    server, stop = _serve(GARBAGE)
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: mlp, network_mode: analytical, layers: 2, batch: 64}\n"
                    "grid: {dp: [1, 2]}\n")
    try:
        code = main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet",
                     "--scheduler", f"tcp://127.0.0.1:{server.server_address[1]}",
                     "--connect-timeout", "1"])
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--scheduler tcp://127.0.0.1:" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
