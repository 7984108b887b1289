"""Embedded services: reuse what answers, refuse a port someone else holds, say what to change."""
from __future__ import annotations

import http.server
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import types
import uuid
from pathlib import Path

import httpx
import pytest

from cake_cli import services
from cake_cli.config import load_settings
from cake_cli.leases import Registry, ServerRecord
from cake_cli.services import (ServiceError, detect_gpus, gpu_policy, prefect_server,
                               ray_runtime)


class _FakePrefect(http.server.BaseHTTPRequestHandler):
    """Answers /api/health like a Prefect server."""

    def do_GET(self):  # noqa: N802 - the http.server name
        ok = self.path == "/api/health"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"true" if ok else b"")

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_prefect():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakePrefect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_port_held_by_another_program_is_one_exact_line(monkeypatch):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
        with pytest.raises(ServiceError) as e:
            with prefect_server(load_settings()):
                pass
    msg = str(e.value)
    m = re.fullmatch(rf"port {port} is in use by another program; stop it or set "
                     rf"CAKE_PREFECT_PORT=(\d+)", msg)
    assert m, msg
    assert int(m.group(1)) != port
    assert "PREFECT_API_URL" not in os.environ


FAKE = str(Path(__file__).with_name("fake_prefect_server.py"))


def _start_fake(port: int, home: Path, hang: bool = False) -> subprocess.Popen:
    """A stand-in server process in its own session, answering (or hanging) on ``port``."""
    proc = subprocess.Popen([sys.executable, FAKE, "server", str(port), str(home), *(["hang"] if hang else [])],
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the fake server did not listen")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _gone(proc: subprocess.Popen, within: float = 30.0) -> bool:
    try:
        proc.wait(within)
        return True
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture
def fakes():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _record(settings, pid: int, port: int, started_by: int) -> None:
    Registry(settings.home).write(ServerRecord(pid=pid, host="127.0.0.1", port=port,
                                               api_url=f"http://127.0.0.1:{port}/api",
                                               started_by=started_by, started_at=time.time()))


_HOLDER = """
import sys, time
from pathlib import Path
from cake_cli.leases import Registry
with Registry(Path(sys.argv[1])).locked() as r:
    lease = r.take_lease()
print("ready", flush=True)
sys.stdin.read()
"""


def _lease_holder(home: Path) -> subprocess.Popen:
    """Another process of this home holding a lease until its stdin closes (or it is killed)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(home)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_server_of_this_home_answering_on_the_port_is_adopted_not_stopped(monkeypatch, free_port, fakes):
    port = free_port()
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    settings = load_settings()
    fakes.append(_start_fake(port, settings.prefect_home))
    monkeypatch.setattr(services, "_start_server", lambda *a: pytest.fail("must not start one"))
    with prefect_server(settings) as pf:
        assert pf.started is False
        assert (pf.api_url, pf.ui_url) == (f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}")
        assert os.environ["PREFECT_API_URL"] == pf.api_url
        assert os.environ["PREFECT_HOME"] == str(settings.prefect_home)
        assert "already answering" in pf.note and "leaves it running" in pf.note
    assert "PREFECT_API_URL" not in os.environ and "PREFECT_HOME" not in os.environ
    assert httpx.get(f"http://127.0.0.1:{port}/api/health").status_code == 200


def test_server_of_another_home_on_the_port_is_refused_with_both_ways_out(monkeypatch, free_port, fakes,
                                                                          tmp_path):
    port = free_port()
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    fakes.append(_start_fake(port, tmp_path / "elsewhere" / "prefect"))
    with pytest.raises(ServiceError) as e:
        with prefect_server(load_settings()):
            pass
    msg = str(e.value)
    assert msg.startswith(f"port {port} is held by a Prefect server of another home ({tmp_path / 'elsewhere'}")
    assert "CAKE_PREFECT_PORT=" in msg and f"CAKE_PREFECT_API_URL=http://127.0.0.1:{port}/api" in msg
    assert fakes[0].poll() is None


def test_server_left_by_a_killed_run_is_reused_knowingly_and_stopped_by_its_last_user(monkeypatch, free_port,
                                                                                      fakes):
    port = free_port()
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    settings = load_settings()
    server = _start_fake(port, settings.prefect_home)
    fakes.append(server)
    _record(settings, server.pid, port, started_by=_dead_pid())
    killed = _lease_holder(settings.home)          # the killed run also left its lease file
    killed.kill()
    killed.wait()
    assert len(list((settings.home / "services" / "leases").glob("*.lease"))) == 1
    with prefect_server(settings) as pf:
        assert pf.started is False and pf.api_url == f"http://127.0.0.1:{port}/api"
        assert "left running by an earlier run that was killed" in pf.note
    assert _gone(server), "the last user did not stop the server"
    assert Registry(settings.home).read() is None
    assert list((settings.home / "services" / "leases").glob("*.lease")) == []


def test_a_server_another_run_uses_is_never_stopped(monkeypatch, free_port, fakes):
    port = free_port()
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    settings = load_settings()
    server = _start_fake(port, settings.prefect_home)
    fakes.append(server)
    other = _lease_holder(settings.home)           # the run that started it, still running
    _record(settings, server.pid, port, started_by=other.pid)
    with prefect_server(settings) as pf:
        assert "sharing this home's Prefect server" in pf.note and "1 other run" in pf.note
    assert server.poll() is None and httpx.get(f"{pf.api_url}/health").status_code == 200
    assert Registry(settings.home).read() is not None
    other.kill()                                   # its owner is killed: the next user stops it
    other.wait()
    with prefect_server(settings) as pf:
        assert "killed" in pf.note
    assert _gone(server)


def test_record_of_a_dead_server_is_replaced(monkeypatch, free_port, fakes):
    port = free_port()
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    settings = load_settings()
    gone = _dead_pid()
    _record(settings, gone, port, started_by=_dead_pid())

    def start(settings, api_url):
        fakes.append(_start_fake(port, settings.prefect_home))
        return fakes[-1]

    monkeypatch.setattr(services, "_start_server", start)
    with prefect_server(settings) as pf:
        assert pf.started is True
        assert f"replaced the record of this home's Prefect server (pid {gone}), which is gone" == pf.note
        assert Registry(settings.home).read().pid == fakes[-1].pid
    assert _gone(fakes[-1]) and Registry(settings.home).read() is None


def test_hung_server_is_killed_and_replaced(monkeypatch, free_port, fakes):
    port, hung_port = free_port(), free_port()
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    monkeypatch.setattr(services, "HEALTH_TIMEOUT_S", 0.5)
    settings = load_settings()
    hung = _start_fake(hung_port, settings.prefect_home, hang=True)
    fakes.append(hung)
    _record(settings, hung.pid, hung_port, started_by=_dead_pid())

    def start(settings, api_url):
        fakes.append(_start_fake(port, settings.prefect_home))
        return fakes[-1]

    monkeypatch.setattr(services, "_start_server", start)
    with prefect_server(settings) as pf:
        assert pf.started and "no longer answered" in pf.note and pf.api_url.endswith(f":{port}/api")
        assert _gone(hung, within=5)
    assert _gone(fakes[-1])


def test_configured_api_url_is_used_when_it_answers(monkeypatch, fake_prefect):
    url = f"http://127.0.0.1:{fake_prefect}/api"
    monkeypatch.setenv("CAKE_PREFECT_API_URL", url)
    with prefect_server(load_settings()) as pf:
        assert (pf.api_url, pf.ui_url, pf.started) == (url, url[:-4], False)
        assert os.environ["PREFECT_API_URL"] == url


def test_unreachable_api_url_says_how_to_use_the_embedded_server(monkeypatch, free_port):
    url = f"http://127.0.0.1:{free_port()}/api"
    monkeypatch.setenv("CAKE_PREFECT_API_URL", url)
    with pytest.raises(ServiceError) as e:
        with prefect_server(load_settings()):
            pass
    msg = str(e.value)
    assert msg.startswith(f"Prefect API at {url} does not answer: ")
    assert msg.endswith("; unset CAKE_PREFECT_API_URL to use the embedded server")
    assert "\n" not in msg


def test_unreachable_ray_address_is_one_line(monkeypatch, free_port):
    monkeypatch.setenv("CAKE_RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    with pytest.raises(ServiceError) as e:
        with ray_runtime(load_settings()):
            pass
    msg = str(e.value)
    assert msg.startswith("Ray at 127.0.0.1:") and "unset CAKE_RAY_ADDRESS" in msg
    assert "\n" not in msg


def test_gpu_require_without_gpu(monkeypatch):
    monkeypatch.setattr(services, "detect_gpus", lambda: [])
    monkeypatch.setenv("CAKE_GPU", "require")
    with pytest.raises(ServiceError) as e:
        gpu_policy(load_settings())
    assert str(e.value) == "no NVIDIA GPU found; run with CAKE_GPU=auto or off to check on the CPU"
    monkeypatch.setenv("CAKE_GPU", "auto")
    assert gpu_policy(load_settings()) == []


def test_gpu_policy_off_and_auto(monkeypatch):
    monkeypatch.setattr(services, "detect_gpus", lambda: ["NVIDIA H200"])
    monkeypatch.setenv("CAKE_GPU", "off")
    assert gpu_policy(load_settings()) == []
    monkeypatch.setenv("CAKE_GPU", "require")
    assert gpu_policy(load_settings()) == ["NVIDIA H200"]


def test_detect_gpus_reads_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\necho 'NVIDIA H200'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(smi.parent))
    assert detect_gpus() == ["NVIDIA H200", "NVIDIA H200"]
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == []


def test_a_registry_held_too_long_is_one_line(monkeypatch, free_port):
    import cake_cli.leases as leases

    monkeypatch.setenv("CAKE_PREFECT_PORT", str(free_port()))
    monkeypatch.setattr(leases, "REGISTRY_WAIT_S", 0.3)
    settings = load_settings()
    holder = subprocess.Popen([sys.executable, "-c", """
import sys, time
from pathlib import Path
from cake_cli.leases import Registry
with Registry(Path(sys.argv[1])).locked():
    print("ready", flush=True)
    time.sleep(600)
""", str(settings.home)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(ServiceError) as e:
            with prefect_server(settings):
                pass
        msg = str(e.value)
        assert "registry.lock stayed locked for 0 s" in msg and "try again" in msg and "\n" not in msg
    finally:
        holder.kill()
        holder.wait()
    assert list((settings.home / "services" / "leases").glob("*.lease")) == []


def test_local_ray_start_is_retried_and_what_a_failed_start_left_is_killed(monkeypatch):
    import ray

    import tasks.ray_runtime as rr

    left: list[subprocess.Popen] = []
    calls = []

    def failing_init(**kwargs):
        calls.append(kwargs)
        left.append(subprocess.Popen(["sleep", "600"]))   # a raylet a failed start leaves behind
        if len(calls) < 3:
            raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(rr, "START_BACKOFF_S", 0.0)
    monkeypatch.setattr(rr, "_init", failing_init)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(gcs_address="127.0.0.1:6380"))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    assert rr.start_ray(None, num_gpus=0) == {"CPU": 2.0}
    assert len(calls) == 3
    assert calls[0]["_node_ip_address"] == "127.0.0.1" and calls[0]["address"] == "local"
    assert os.environ[rr.SINGLE_NODE_ENV] == "0"
    for p in left[:2]:
        assert p.wait(10) == -signal.SIGKILL
    left[2].kill()
    left[2].wait()


def test_local_ray_that_never_starts_is_one_line(monkeypatch):
    import tasks.ray_runtime as rr

    def failing_init(**kwargs):
        raise Exception("The current node timed out during startup.\nmore")

    monkeypatch.setattr(rr, "START_BACKOFF_S", 0.0)
    monkeypatch.setattr(rr, "_init", failing_init)
    with pytest.raises(ServiceError) as e:
        with ray_runtime(load_settings(), num_gpus=0):
            pass
    msg = str(e.value)
    assert msg.startswith("a local Ray did not start after 3 tries in ")
    assert "(last: The current node timed out during startup.)" in msg and "CAKE_RAY_ADDRESS" in msg
    assert "\n" not in msg


def _listeners(marker: str) -> list[tuple[str, str]]:
    """(local address, process name) of every TCP listener of a process whose environment holds ``marker``."""
    pids = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                    pids.add(int(d))
            except OSError:
                continue
    out = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines():
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', line):
            if int(pid) in pids:
                out.append((line.split()[3], name))
    return out


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "::ffff:127.0.0.1", "::1")


@pytest.mark.services
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss to list listening sockets")
def test_real_prefect_server_and_ray_on_loopback_with_this_homes_database(monkeypatch, free_port):
    port = free_port()
    marker = f"CAKE_TEST_MARK={uuid.uuid4().hex}"
    monkeypatch.setenv(*marker.split("="))
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    settings = load_settings()
    api = f"http://127.0.0.1:{port}/api"
    with prefect_server(settings) as first:
        assert first.started and first.api_url == api
        assert httpx.get(f"{api}/health").json() is True
        # the UI asks the API on the port it is served from, not on 4200
        assert httpx.get(f"http://127.0.0.1:{port}/ui-settings").json()["api_url"] == api
        assert httpx.get(f"{api}/admin/settings").json()["home"] == str(settings.prefect_home)
        assert (settings.prefect_home / "prefect.db").exists()
        with prefect_server(settings) as second:   # a second `cake` process would do this
            assert second.started is False and second.api_url == api
            assert "sharing" in second.note
        assert httpx.get(f"{api}/health").status_code == 200   # the second user left it running

        import ray

        with ray_runtime(settings, num_gpus=0) as rt:
            assert rt.started and rt.resources.get("GPU", 0) == 0
            assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")

            @ray.remote
            def worker_env():
                return os.environ.get("PREFECT_API_URL"), os.environ.get("PREFECT_HOME")

            assert ray.get(worker_env.remote()) == (api, str(settings.prefect_home))
            listening = _listeners(marker)
            names = {n for _, n in listening}
            assert "gcs_server" in names and "raylet" in names and "prefect" in " ".join(names), listening
            assert [a for a in listening if not _loopback(a[0])] == [], "listening beyond loopback"
        assert not ray.is_initialized()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{api}/health", timeout=1)
    assert (settings.logs_dir / "prefect-server.log").exists()
    assert Registry(settings.home).read() is None
    assert _listeners(marker) == [], "a process of this test still listens"


@pytest.mark.services
def test_cake_server_keeps_the_homes_server_up_until_ctrl_c(free_port, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAKE_", "PREFECT_"))}
    env.update({"CAKE_HOME": str(tmp_path / "home"), "CAKE_PREFECT_PORT": str(port)})
    cake = str(Path(sys.executable).parent / "cake")

    def interactive():
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # as from a terminal (a test runner may ignore it)

    proc = subprocess.Popen([cake, "server"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=interactive)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"Prefect UI: http://127.0.0.1:{port}"), line
        assert httpx.get(f"http://127.0.0.1:{port}/api/health").json() is True
        # another command of the home uses the server through a lease of its own, and leaves it up
        other = subprocess.run([cake, "harness", "approve", "prop-nope", "--reason", "r"], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
        assert other.returncode == 1 and "prop-nope" in other.stderr, other.stderr
        assert httpx.get(f"http://127.0.0.1:{port}/api/health").json() is True
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
        assert "left the Prefect server" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1)
    assert Registry(tmp_path / "home").read() is None
