"""Cake's configuration, in one place, validated at start-up.

Sources, highest priority first:

1. environment variables ``CAKE_<SETTING>`` (``CAKE_PREFECT_PORT=4300``);
   an empty variable counts as unset;
2. a TOML file of top-level ``setting = value`` lines: the path in
   ``CAKE_CONFIG`` (which must exist), else ``cake.toml`` in the current
   directory (optional);
3. the defaults below.

Every bad value becomes one :class:`ConfigError` line that names the setting,
where the value came from, the value and what is allowed. Unknown keys in the
file are rejected, so a typo never silently falls back to a default.
"""
from __future__ import annotations

import os
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from cake_core.errors import CakeError

ENV_PREFIX = "CAKE_"
CONFIG_ENV = "CAKE_CONFIG"           # path of the TOML file; overrides ./cake.toml
DEFAULT_CONFIG_FILE = "cake.toml"

# What each setting accepts, said the way an error message should say it.
ALLOWED: dict[str, str] = {
    "home": "a directory path (holds warehouse/, cache/, logs/, prefect/ and services/)",
    "prefect_api_url": "an http(s) URL of a Prefect API such as http://127.0.0.1:4200/api, or unset",
    "prefect_host": "a host name or IP address such as 127.0.0.1",
    "prefect_port": "an integer from 1 to 65535",
    "ray_address": "a Ray address such as auto, HOST:6379 or ray://HOST:10001, or unset",
    "gpu": "one of auto, off, require",
    "gpu_model": "a GPU model such as H200 (a Ray resource gpu_model:H200), or unset",
    "gpu_count": "an integer of at least 1 (GPU runners a run starts at most), or unset",
    "workers": "an integer of at least 1",
    "llm_base_url": "an http(s) URL of an OpenAI-compatible API, or unset",
    "llm_model": "a model name, or unset",
    "llm_api_key_env": "the name of an environment variable that holds the API key",
    "problem_path": "folders of problem packages, separated by the path separator (':' here), or unset",
}


class ConfigError(CakeError):
    """A setting is missing, unknown or has a value that is not allowed."""


def _default_workers() -> int:
    return max(1, os.cpu_count() or 1)


# The file's parsed contents for the load in progress (see Settings.settings_customise_sources).
_FILE_DATA: ContextVar[dict[str, Any]] = ContextVar("cake_config_file_data", default={})


class _FileSource(PydanticBaseSettingsSource):
    """Values read from the TOML file by :func:`load_settings`."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


class Settings(BaseSettings):
    """Every knob Cake has. Build it with :func:`load_settings`, not directly."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True,
                                      extra="forbid", validate_default=True)

    home: Path = Path(".cake")                 # warehouse/, cache/, logs/, prefect/, services/
    prefect_api_url: str | None = None         # None: the embedded local server
    prefect_host: str = "127.0.0.1"            # where the embedded server listens
    prefect_port: int = Field(4200, ge=1, le=65535)
    ray_address: str | None = None             # None: a local Ray started by Cake
    gpu: Literal["auto", "off", "require"] = "auto"
    gpu_model: str | None = None               # None: this machine's GPUs' model
    gpu_count: int | None = Field(None, ge=1)  # None: one GPU runner per GPU of the model Ray offers
    workers: int = Field(default_factory=_default_workers, ge=1)  # CPU workers
    llm_base_url: str | None = None            # None: the OpenAI default endpoint
    llm_model: str | None = None               # None: the LLM agent is unavailable
    llm_api_key_env: str = "OPENAI_API_KEY"    # the key itself never sits in a file
    problem_path: str | None = None            # problem folders beside the built-in and installed ones

    @property
    def problem_paths(self) -> list[Path]:
        """The folders of ``problem_path``, each absolute."""
        return [Path(p).expanduser().absolute() for p in (self.problem_path or "").split(os.pathsep) if p.strip()]

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, v: Path) -> Path:
        return v.expanduser().absolute()

    @field_validator("prefect_api_url", "llm_base_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")) or len(v.split("://", 1)[1]) == 0:
            raise ValueError("not an http(s) URL")
        return v

    @field_validator("prefect_host", "llm_api_key_env", "ray_address", "llm_model", "gpu_model")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("blank")
        return v.strip() if v is not None else None

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win: explicit arguments, then the environment, then the file.
        return init_settings, env_settings, _FileSource(settings_cls, _FILE_DATA.get())

    # Paths derived from home: one definition, used by the CLI and the flows.
    @property
    def warehouse_root(self) -> Path:
        return self.home / "warehouse"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def prefect_home(self) -> Path:
        """PREFECT_HOME of everything Cake runs for this home: its own Prefect database and profiles."""
        return self.home / "prefect"


def config_file() -> Path | None:
    """The TOML file to read: ``$CAKE_CONFIG`` (which must exist), else ``./cake.toml`` if present."""
    named = os.environ.get(CONFIG_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    local = Path.cwd() / DEFAULT_CONFIG_FILE
    if local.exists() and not local.is_file():
        raise ConfigError(f"{local} is not a file (a directory?): the configuration is read from ./"
                          f"{DEFAULT_CONFIG_FILE}; move it aside or name another file with {CONFIG_ENV}")
    return local if local.is_file() else None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} (named by {CONFIG_ENV}) does not exist; "
                          f"create it or unset {CONFIG_ENV}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}); "
                          f"TOML files must be UTF-8") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    unknown = sorted(set(data) - set(Settings.model_fields))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
                          f"allowed: {', '.join(Settings.model_fields)}")
    return data


def _env_name(field: str) -> str | None:
    """The environment variable that set ``field``, if one did (names are case-insensitive)."""
    want = (ENV_PREFIX + field).upper()
    for name, value in os.environ.items():
        if name.upper() == want and value != "":
            return name
    return None


def _one_line(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the configuration; raise :class:`ConfigError` on the first sign of trouble.

    Parameters
    ----------
    **overrides
        Values that beat every source (tests, programmatic use).

    Returns
    -------
    Settings
        The validated settings.
    """
    path = config_file()
    data = _read_file(path) if path is not None else {}
    token = _FILE_DATA.set(data)
    try:
        return Settings(**overrides)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            env = _env_name(field)
            if field in overrides:
                source, value = "given by the caller", overrides[field]
            elif env is not None:
                source, value = f"from environment variable {env}", os.environ[env]
            elif field in data:
                source, value = f"from {path}", data[field]
            else:
                source, value = "default", err.get("input")
            allowed = ALLOWED.get(field, err["msg"])
            problems.append(f"setting {field} = {_one_line(value)} ({source}) is not allowed: "
                            f"expected {allowed}")
        raise ConfigError("; ".join(problems)) from None
    finally:
        _FILE_DATA.reset(token)
