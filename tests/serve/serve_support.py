"""Fixtures for server tests: the real `osprey serve` binary on a free port over a copy of the demo repository."""

import http.client
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 60
STOP_DEADLINE_S = 30
MAX_BODY = 1 << 20  # --max-body-size of the shared server


sys.path.insert(0, str(REPO / "tests"))
from pytest_support import osprey_bin  # noqa: E402,F401  (shared fixture)


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """demo-models/digits (made by scripts/setup; made here when missing)."""
    root = REPO / "demo-models"
    if not (root / "digits" / "1" / "model.onnx").is_file():
        subprocess.run([sys.executable, str(REPO / "tools" / "make_demo_model.py"), "--out", str(root)], check=True,
                       timeout=600)
    return root / "digits"


@pytest.fixture(scope="session")
def repository(tmp_path_factory, demo_model) -> Path:
    """A repository with the demo model twice: `digits` (read-only tests) and `digits2` (load/unload tests)."""
    root = tmp_path_factory.mktemp("repo")
    (root / "digits").symlink_to(demo_model, target_is_directory=True)
    (root / "digits2").symlink_to(demo_model, target_is_directory=True)
    return root


class Server:
    """A running `osprey serve` process."""

    def __init__(self, osprey_bin, repository, *extra):
        # --port 0: the server binds a free port itself and names it in its start line, so two test runs on one
        # machine can never race for a port (or talk to each other's server).
        self.log = tempfile.NamedTemporaryFile("w+", prefix="serve-", suffix=".log", dir=Path(repository).parent,
                                               delete=False)
        cmd = [str(osprey_bin), "serve", "--model-repository", str(repository), "--port", "0",
               "--threads", "1", *[str(a) for a in extra]]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_DEADLINE_S
        self.port = None
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"osprey serve exited with {self.proc.returncode}: {self.output()}", pytrace=False)
            if self.port is None:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.output())
                if m:
                    self.port = int(m.group(1))
                    self.url = f"http://127.0.0.1:{self.port}"
            if self.port is not None:
                try:
                    if self.request("GET", "/v2/health/ready")[0] == 200:
                        break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"osprey serve not ready within {START_DEADLINE_S} s: {self.output()}", pytrace=False)
            time.sleep(0.05)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers dict with lowercase names, body bytes) over a new connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, method, path, body=None, headers=None):
        status, _, data = self.request(method, path, body, headers)
        return status, json.loads(data) if data else None

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"osprey serve did not stop within {STOP_DEADLINE_S} s after SIGTERM", pytrace=False)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def start_server(osprey_bin, repository):
    """start_server(*extra_args) -> Server; every server started is killed at the end of the session."""
    started = []

    def start(*extra):
        server = Server(osprey_bin, repository, *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def start_repo(osprey_bin):
    """start_repo(repository, *extra_args) -> Server on that repository; killed when the test ends."""
    started = []

    def start(repository, *extra):
        server = Server(osprey_bin, repository, *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def server(start_server):
    return start_server("--max-body-size", MAX_BODY, "--http-threads", 4)


@pytest.fixture(scope="session")
def triton(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=60)
    yield client
    client.close()
