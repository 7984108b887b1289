"""One Prefect server and one local Ray for the flow tests (they take ~30 s to start on 2 cores)."""
import os
import socket

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def services(tmp_path_factory, compile_cache):
    from cake_cli.config import load_settings
    from cake_cli.services import prefect_server, ray_runtime

    home = tmp_path_factory.mktemp("cake-home")
    (home / "cache").symlink_to(compile_cache, target_is_directory=True)   # the session's cubins
    port = _free_port()
    env = {"CAKE_HOME": str(home), "CAKE_PREFECT_PORT": str(port), "CAKE_GPU": "off"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings = load_settings()
    with prefect_server(settings) as server, ray_runtime(settings, num_gpus=0):
        yield {"home": home, "api_url": server.api_url, "port": port, "settings": settings}
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
