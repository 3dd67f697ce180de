"""distill's part of a process: its router and the distiller (built here unless one was given)."""

from __future__ import annotations

from services.distill.router import build_router
from shared.adapters.distillers.builtin import BuiltinDistiller
from shared.adapters.distillers.openai_compat import OpenAICompatDistiller
from shared.adapters.judges import OpenAICompatJudge
from shared.ports import Distiller, SupersessionJudge
from shared.runtime.settings import EngramSettings
from shared.service.component import Component, Ports
from shared.service.infra import Infra

__all__ = ["build", "build_distiller", "build_judge"]


def build_distiller(settings: EngramSettings) -> Distiller:
    if settings.distill_model_url:
        return OpenAICompatDistiller(
            base_url=settings.distill_model_url,
            model=settings.distill_model,
            api_key=settings.distill_api_key.get_secret_value() or None,
            timeout_s=settings.distill_timeout_s,
            retries=settings.distill_retries,
        )
    return BuiltinDistiller()


def build_judge(settings: EngramSettings) -> SupersessionJudge | None:
    """The knowledge-update judge: the distill model, when one is configured; None: the offline
    rules decide alone (docs/adr/0103-knowledge-updates.md)."""
    if not settings.distill_model_url:
        return None
    return OpenAICompatJudge(
        base_url=settings.distill_model_url,
        model=settings.distill_model,
        api_key=settings.distill_api_key.get_secret_value() or None,
        timeout_s=min(settings.distill_timeout_s, 10.0),
    )


def build(infra: Infra, ports: Ports) -> Component:
    # A distiller the caller brought is the caller's to close.
    distiller = ports.distiller or build_distiller(infra.settings)
    judge = build_judge(infra.settings)
    component = Component("distill", routers=[build_router(infra, distiller, judge)])
    if ports.distiller is None:
        component.closers.append(distiller.aclose)
    if judge is not None:
        component.closers.append(judge.aclose)
    return component
