"""Embedded services: reuse what answers, refuse a port someone else holds, say what to change."""
from __future__ import annotations

import http.server
import os
import re
import socket
import stat
import threading

import httpx
import pytest

from cake_cli import services
from cake_cli.config import load_settings
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


def test_running_server_on_the_port_is_reused_not_stopped(monkeypatch, fake_prefect):
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(fake_prefect))
    monkeypatch.setattr(services, "_start_server", lambda *a: pytest.fail("must not start one"))
    with prefect_server(load_settings()) as pf:
        assert pf.started is False
        assert pf.api_url == f"http://127.0.0.1:{fake_prefect}/api"
        assert pf.ui_url == f"http://127.0.0.1:{fake_prefect}"
        assert os.environ["PREFECT_API_URL"] == pf.api_url
    assert "PREFECT_API_URL" not in os.environ
    assert httpx.get(f"http://127.0.0.1:{fake_prefect}/api/health").status_code == 200


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


@pytest.mark.services
def test_real_prefect_server_started_reused_and_stopped_then_ray_sees_the_url(monkeypatch, free_port):
    port = free_port()
    monkeypatch.setenv("CAKE_PREFECT_PORT", str(port))
    settings = load_settings()
    api = f"http://127.0.0.1:{port}/api"
    with prefect_server(settings) as first:
        assert first.started and first.api_url == api
        assert httpx.get(f"{api}/health").json() is True
        with prefect_server(settings) as second:   # a second `cake` process would do this
            assert second.started is False and second.api_url == api
        assert httpx.get(f"{api}/health").status_code == 200   # the reuser left it running

        import ray

        with ray_runtime(settings, num_gpus=0) as rt:
            assert rt.started and rt.resources.get("GPU", 0) == 0

            @ray.remote
            def worker_env():
                return os.environ.get("PREFECT_API_URL")

            assert ray.get(worker_env.remote()) == api
        assert not ray.is_initialized()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{api}/health", timeout=1)
    assert (settings.logs_dir / "prefect-server.log").exists()
