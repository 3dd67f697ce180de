"""Hot reads without SQLAlchemy's per-call work: a statement built and compiled once per shape,
run with asyncpg.

A recall reads one to four statements. Through an ORM session each cost ~1.8 ms more than the
query itself on this machine under load (building the statement tree, its cache key, the ORM
execute path, row processing; docs/benchmarks.md, "2026-12-01 — Recall's hot path"),
several times the NATS round trip the latency goal is measured against. A :class:`Template`
builds its statement from named binds only — a builder never sees a call's values, so a value
cannot be baked into a cached statement — compiles it for asyncpg once per shape (which optional
parts the predicate has), and :meth:`shared.storage.db.engine.Database.fetch` runs the SQL text with the
call's values in bind order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, ClauseElement, ColumnElement, any_, bindparam
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

__all__ = ["Binds", "Compiled", "Template", "one_of"]

_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]


def one_of(column: ColumnElement[Any], value: Iterable[Any] | BindParameter[Any]) -> ColumnElement[bool]:
    """``column IN (...)`` for a list of values; ``column = ANY(:name)`` for a bind of a list (a
    template's: one statement whatever the list's length)."""
    if isinstance(value, BindParameter):
        return column == any_(value)
    return column.in_(list(value))


class Binds:
    """Stands in for a call's values while a template's statement is built: ``binds["name"]``
    is the named bind ``:name`` (the same object each time, so a value used twice binds once)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self._made: dict[str, BindParameter[Any]] = {}

    def __getitem__(self, name: str) -> BindParameter[Any]:
        if name not in self.names:
            raise KeyError(f"no value named {name!r} in this call's values")
        if name not in self._made:
            self._made[name] = bindparam(name, required=False)
        return self._made[name]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def get(self, name: str) -> BindParameter[Any] | None:
        return self[name] if name in self.names else None


@dataclass(frozen=True)
class Compiled:
    """One statement as asyncpg runs it: SQL text with ``$n`` placeholders, the bind name of each."""

    sql: str
    names: tuple[str, ...]
    #: the statement's own constants (``lifecycle = 'active'``), bound like the call's values
    constants: Mapping[str, Any]

    @classmethod
    def of(cls, stmt: ClauseElement, values: frozenset[str]) -> Compiled:
        # Constant IN lists (``status IN ("pending", "failed")``) become plain binds, as asyncpg needs.
        compiled = stmt.compile(dialect=_DIALECT, compile_kwargs={"render_postcompile": True})
        names = tuple(getattr(compiled, "positiontup", None) or ())  # SQLCompiler's, for $n styles
        constants = {n: v for n, v in compiled.params.items() if n not in values}
        unbound = [n for n in names if n not in values and constants.get(n) is None]
        if unbound:  # a bind with neither a call value nor a constant: a builder's mistake
            raise ValueError(f"statement binds {unbound} without values")
        return cls(str(compiled), names, constants)

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        return [values[n] if n in values else self.constants[n] for n in self.names]


class Template:
    """A statement of ``build(binds)``, compiled once per shape.

    The shape is the set of value names a call brings (a builder branches only on which names
    are there, e.g. ``"layer" in binds``): two calls with the same names get the same SQL."""

    def __init__(self, build: Callable[[Binds], ClauseElement]) -> None:
        self._build = build
        self._compiled: dict[frozenset[str], Compiled] = {}

    def compiled(self, values: Mapping[str, Any]) -> Compiled:
        names = frozenset(values)
        hit = self._compiled.get(names)
        if hit is None:
            hit = Compiled.of(self._build(Binds(names)), names)
            self._compiled[names] = hit
        return hit
