"""The agent's HTTP server (daemon.serve) against hostile and careless clients on 127.0.0.1: idle
connections, bursts, clients that leave mid-answer, and what the Server header gives away.
The agent behind it is real; its self-test results come from a SIMULATION file (no AMD GPU here)."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import struct
import threading
import time

import pytest

from gluon_agent.daemon import Agent, AgentConfig, serve
from gluon_common.kube import NodeApi, make_api_client
from gluon_localcluster.fakes.simulated import SimulatedSource, simulated_node

IDLE = 0.5  # the idle timeout these tests give the server
BURST = 64  # connections opened at once


@pytest.fixture
def agent(tmp_path):
    """A real Agent that never runs its loop: only its HTTP server is under test (no API calls are made)."""
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(simulated_node()))
    return Agent(
        AgentConfig(node_name="n1", host="127.0.0.1", port=0),
        NodeApi(make_api_client("http://127.0.0.1:1"), "n1"),
        SimulatedSource(sim),
    )


@pytest.fixture
def server(agent):
    server = serve(agent, idle_timeout=IDLE)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def connect(server, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(server.server_address[:2], timeout=timeout)


def test_an_idle_connection_is_closed_after_the_idle_timeout(server):
    """A client that connects and says nothing no longer holds a server thread for ever."""
    with connect(server) as silent:
        started = time.monotonic()
        assert silent.recv(1) == b""  # the server closed it (a socket.timeout here: it never did)
        assert time.monotonic() - started < IDLE + 3


def test_a_slow_request_is_dropped_too(server):
    """Half a request line, then silence: dropped after the idle timeout as well."""
    with connect(server) as slow:
        slow.sendall(b"GET /hea")
        assert slow.recv(1) == b""


def test_a_burst_of_connections_is_queued_not_refused(agent):
    """The listen backlog holds a burst while no thread accepts: the 1 s probe behind it still connects."""
    server = serve(agent, idle_timeout=IDLE)  # not serving yet: every connection waits in the backlog
    sockets = []
    try:
        for _ in range(BURST):
            sockets.append(connect(server, timeout=0.5))  # past a full backlog the SYN is dropped: timeout
    finally:
        for s in sockets:
            s.close()
        server.server_close()
    assert len(sockets) == BURST


def test_the_server_header_names_no_python(server):
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        answer.read()
    finally:
        connection.close()
    assert answer.getheader("Server") == "gluon-agent"


@pytest.mark.parametrize(
    "error", [BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "Connection reset by peer")]
)
def test_a_client_that_went_away_logs_no_traceback(server, error, capfd, caplog):
    """socketserver prints a traceback to stderr for every exception of a request; a client leaving is routine."""
    caplog.set_level(logging.DEBUG, logger="gluon_agent")
    try:
        raise error
    except OSError:
        server.handle_error(None, ("127.0.0.1", 1))
    assert "Traceback" not in capfd.readouterr().err
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_other_errors_are_logged_with_their_traceback(server, caplog):
    try:
        raise ValueError("a bug")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 1))
    [record] = [r for r in caplog.records if r.name == "gluon_agent"]
    assert record.levelno == logging.WARNING and record.exc_info is not None


def test_clients_resetting_mid_answer_leave_the_server_serving(server, capfd):
    """Real resets: each client sends a request and closes with RST (SO_LINGER 0) before the answer."""
    for _ in range(20):
        with connect(server) as rude:
            rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            rude.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)  # let the handler threads meet the resets
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    try:
        connection.request("GET", "/healthz")
        assert connection.getresponse().status in (200, 503)
    finally:
        connection.close()
    assert "Traceback" not in capfd.readouterr().err
