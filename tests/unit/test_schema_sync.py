"""The checked-in JSON Schema files under ``contracts/schema/`` match the wire models."""

from __future__ import annotations

from contracts.schema_export import SCHEMA_DIR, generate

REGENERATE = "run `python -m contracts.schema_export` and commit contracts/schema/"


def _on_disk() -> dict[str, str]:
    # Bytes, not read_text: a newline translated on the way in would hide a real difference.
    return {path.name: path.read_bytes().decode("utf-8") for path in SCHEMA_DIR.glob("*.json")}


def test_every_model_has_an_up_to_date_schema_file() -> None:
    """Each public model's schema file exists and equals what the model generates today."""
    expected, on_disk = generate(), _on_disk()
    missing = sorted(name for name in expected if name not in on_disk)
    stale = sorted(name for name in expected if name in on_disk and on_disk[name] != expected[name])
    assert not missing, f"schema files missing: {missing}; {REGENERATE}"
    assert not stale, f"schema files out of date: {stale}; {REGENERATE}"


def test_no_schema_file_without_a_model() -> None:
    """No schema file is left behind for a model that was renamed or removed."""
    extra = sorted(_on_disk().keys() - generate().keys())
    assert not extra, f"schema files without a model: {extra}; {REGENERATE}"
