"""Model files: one JSON document per model version, a header and a checksummed payload.

    {"format": "cake-cost-model", "format_version": 1,
     "kind": "analytic" | "learned", "version": "...", "target": "sm_90a", "gpu": "H200",
     "feature_schema": [...FEATURE_NAMES], "schema_hash": "...", "created_at": "...",
     ...header_extra (training data, held-out comparison)...,
     "payload": {...}, "checksum": sha256 of the payload's canonical JSON}

``load_model`` refuses (``ModelFileError``, one line saying what and what to do) a file that is not JSON,
not of this format, of another GPU or target, of a feature schema this code does not compute, whose
checksum does not match its payload, or whose payload its kind cannot read. ``model_for_run`` turns every
such refusal (and a learned model that did not beat the analytic one on held-out data) into the analytic
model and a line saying why.
"""
from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cake_core.model.base import CostModelBase, ModelFileError
from cake_core.model.features import FEATURE_NAMES

FORMAT = "cake-cost-model"
FORMAT_VERSION = 1


def schema_hash(names: tuple[str, ...] | list[str] = FEATURE_NAMES) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def _checksum(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _kinds() -> dict[str, type[CostModelBase]]:
    from cake_core.model.analytic import AnalyticModel
    from cake_core.model.learned import LearnedModel
    return {AnalyticModel.kind: AnalyticModel, LearnedModel.kind: LearnedModel}


def save_model(model: CostModelBase, path: str | Path) -> Path:
    """Write ``model`` to ``path`` (atomically: a temporary file renamed into place)."""
    path = Path(path)
    payload = model.payload()
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": model.kind, "version": model.version,
           "target": model.target, "gpu": model.gpu, "feature_schema": list(FEATURE_NAMES),
           "schema_hash": schema_hash(), "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           **model.header_extra(), "payload": payload, "checksum": _checksum(payload)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def read_header(path: str | Path) -> dict[str, Any]:
    """The file's header (everything but the payload), checked as ``load_model`` checks it."""
    doc = _read(Path(path))
    return {k: v for k, v in doc.items() if k != "payload"}


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ModelFileError(f"model file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelFileError(f"model file {path} cannot be read ({e})") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ModelFileError(f"model file {path} is corrupted: not JSON ({e}); refit it with `cake model fit`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelFileError(f"{path} is not a Cake cost-model file (no \"format\": \"{FORMAT}\")")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ModelFileError(f"model file {path} has format version {doc.get('format_version')!r}; this code reads "
                             f"version {FORMAT_VERSION}: refit it with `cake model fit`")
    if "payload" not in doc or doc.get("checksum") != _checksum(doc["payload"]):
        raise ModelFileError(f"model file {path} is corrupted: its payload does not match its checksum; "
                             "refit it with `cake model fit`")
    return doc


def load_model(path: str | Path, gpu: str | None = None) -> CostModelBase:
    """The model saved in ``path``; with ``gpu``, refused unless it is that GPU's (and its target's)."""
    path = Path(path)
    doc = _read(path)
    kinds = _kinds()
    kind = doc.get("kind")
    if kind not in kinds:
        raise ModelFileError(f"model file {path} is of kind {kind!r}; known kinds: {', '.join(kinds)}")
    if gpu is not None:
        from cake_core.model.charges import load_gpu
        want = load_gpu(gpu)
        if str(doc.get("gpu", "")).upper() != want["name"].upper() or doc.get("target") != want["arch"]:
            raise ModelFileError(f"model file {path} is for {doc.get('gpu')} ({doc.get('target')}), not "
                                 f"{want['name']} ({want['arch']}); fit one on {want['name']} measurements")
    if doc.get("schema_hash") != schema_hash() and kind != "analytic":
        raise ModelFileError(f"model file {path} was fitted on another feature schema ({doc.get('schema_hash')}, "
                             f"this code: {schema_hash()}); refit it with `cake model fit`")
    return kinds[kind].from_payload(str(doc["gpu"]).upper(), str(doc["version"]), doc["payload"], doc)


def model_for_run(path: str | Path | None, gpu: str, fallback: CostModelBase | None = None,
                  problem: str | None = None) -> tuple[CostModelBase, str]:
    """The model a run uses, and a line saying which and why: the file's model when it loads, is for
    ``gpu`` and (if learned) beat the analytic model on held-out data -- on ``problem``'s own cells where they
    were graded; else ``fallback`` (by default the analytic model)."""
    from cake_core.model.analytic import AnalyticModel

    base = fallback if fallback is not None else AnalyticModel(gpu)
    if path is None:
        return base, f"cost model: {base.kind} {base.version} (no model file given)"
    try:
        model = load_model(path, gpu)
    except ModelFileError as e:
        return base, f"falling back to the analytic model: {e}"
    if model.kind == "learned":
        won, why = model.beats_analytic_on(problem)
        if not won:
            return base, (f"falling back to the analytic model: learned model {model.version} did not beat "
                          f"the analytic one on held-out data ({why})")
        return model, f"cost model: learned {model.version} from {path} ({why})"
    return model, f"cost model: {model.kind} {model.version} from {path}"
