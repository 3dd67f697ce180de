"""Generate the checked-in JSON Schema of every public wire model into ``contracts/schema/``.

    python -m contracts.schema_export            # (re)write the files
    python -m contracts.schema_export --check    # exit 1 if any file is missing, stale or extra

Models we receive (:class:`~contracts.common.Inbound`) are described as they are validated;
everything else as it is serialized. ``tests/unit/test_schema_sync.py`` fails when the files
drift from the models.

The checked-in documents built from the same models (``contracts/asyncapi.json``,
``contracts/openapi.json``) share what is not theirs from here: :func:`component_schema` to collect
models into a document, :func:`render` for the file's text and :func:`document_main` for the
write-or-``--check`` command line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from contracts.common import Inbound

__all__ = [
    "MODEL_MODULES",
    "SCHEMA_DIR",
    "check",
    "component_schema",
    "document_main",
    "engram_version",
    "generate",
    "main",
    "public_models",
    "render",
]

#: The modules whose ``__all__`` models are published.
MODEL_MODULES = (
    "contracts.events",
    "contracts.requests",
    "contracts.config",
    "contracts.recall",
    "contracts.governance",
    "contracts.feeds",
)
SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
_JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def component_schema(model: type[BaseModel], schemas: dict[str, Any], prefix: str) -> dict[str, str]:
    """Add ``model`` (and the models it nests) to ``schemas`` — an AsyncAPI or OpenAPI document's
    ``components/schemas`` — and return a ``$ref`` to it; refs point to ``prefix`` + name instead
    of a local ``$defs``. Modes as for the files: what we receive as validated, what we send as
    serialized."""
    mode: JsonSchemaMode = "validation" if issubclass(model, Inbound) else "serialization"
    body = model.model_json_schema(mode=mode, ref_template=prefix + "{model}")
    for name, schema in {**body.pop("$defs", {}), model.__name__: body}.items():
        if schemas.setdefault(name, schema) != schema:
            raise RuntimeError(f"two different schemas are named {name}")
    return {"$ref": prefix + model.__name__}


def render(doc: Any) -> str:
    """A checked-in JSON file's text: pretty-printed, sorted keys, trailing newline."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def engram_version() -> str:
    """The installed package's version, for a document's ``info``; 0.1.0 from a bare checkout."""
    try:
        return version("engram")
    except PackageNotFoundError:
        return "0.1.0"


def document_main(
    argv: Sequence[str] | None,
    *,
    path: Path,
    build: Callable[[], Any],
    prog: str,
    description: str | None,
    to_text: Callable[[Any], str] = render,
) -> int:
    """``python -m <prog> [--check]`` for one generated document: write ``path`` when it differs
    from ``to_text(build())`` (JSON by :func:`render` unless told otherwise), or with ``--check``
    exit 1 when it is missing or stale."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--check", action="store_true", help="report drift and exit 1 instead of writing")
    args = parser.parse_args(argv)
    expected = to_text(build())
    on_disk = path.read_bytes().decode("utf-8") if path.is_file() else None
    if args.check:
        if on_disk != expected:
            state = "missing" if on_disk is None else "out of date"
            print(f"{path} is {state}; run `python -m {prog}`", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    if on_disk != expected:
        # Bytes, so the newline is ``\n`` on every platform and the test compares exactly.
        path.write_bytes(expected.encode("utf-8"))
        print(f"wrote: {path}")
    return 0


def public_models() -> Iterator[type[BaseModel]]:
    """Every pydantic model named in the ``__all__`` of :data:`MODEL_MODULES`."""
    for module_name in MODEL_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseModel):
                yield obj


def generate() -> dict[str, str]:
    """``{"<ModelName>.json": schema text}``: pretty-printed, sorted keys, trailing newline."""
    files: dict[str, str] = {}
    for model in public_models():
        filename = f"{model.__name__}.json"
        if filename in files:
            raise RuntimeError(f"two public models are named {model.__name__}; schema files would collide")
        # What we receive is described as validated (input shapes), what we send as serialized.
        mode: JsonSchemaMode = "validation" if issubclass(model, Inbound) else "serialization"
        files[filename] = render({"$schema": _JSON_SCHEMA_DIALECT, **model.model_json_schema(mode=mode)})
    return dict(sorted(files.items()))


def check(directory: Path = SCHEMA_DIR) -> list[str]:
    """What differs between ``directory`` and :func:`generate`, one line per file; empty if in sync."""
    expected = generate()
    on_disk = _read_schema_files(directory)
    problems = [f"missing: {name}" for name in expected if name not in on_disk]
    problems += [f"stale: {name}" for name in expected if name in on_disk and on_disk[name] != expected[name]]
    problems += [f"extra: {name}" for name in on_disk if name not in expected]
    return problems


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    """Make ``directory`` equal :func:`generate`: write changed files, delete extra ones."""
    expected = generate()
    on_disk = _read_schema_files(directory)
    directory.mkdir(parents=True, exist_ok=True)
    changed: list[str] = []
    for name, content in expected.items():
        if on_disk.get(name) != content:
            # Bytes, so the newline is ``\n`` on every platform and the test compares exactly.
            (directory / name).write_bytes(content.encode("utf-8"))
            changed.append(f"wrote: {name}")
    for name in on_disk.keys() - expected.keys():
        (directory / name).unlink()
        changed.append(f"removed: {name}")
    return sorted(changed)


def _read_schema_files(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    return {path.name: path.read_bytes().decode("utf-8") for path in sorted(directory.glob("*.json"))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contracts.schema_export", description=__doc__)
    parser.add_argument("--check", action="store_true", help="report drift and exit 1 instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run `python -m contracts.schema_export` to regenerate", file=sys.stderr)
            return 1
        print(f"{len(generate())} schema files in {SCHEMA_DIR} are up to date")
        return 0
    for line in write():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
