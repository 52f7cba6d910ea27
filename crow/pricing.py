"""What a session's model calls cost: prices per model, and the session's running total.

Prices are USD per million tokens: the user's `model_settings.REF.pricing` (crow/config.py;
a project's crow.yaml may not set them, crow/project_config.py), else the list prices
below. The total (`Session.cost`) is stored with the session and is known only while every
call it counts was priced: one call of a model without a price (or without reported
usage) makes it None for good, and no cost is shown rather than a total that leaves that
call out. A price of 0 (a local model) keeps it known.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from crow.config import Pricing
from crow.errors import StoreError

if TYPE_CHECKING:
    from crow.config import Config
    from crow.llm.base import ModelRequest, Provider, Usage
    from crow.session import Session

log = logging.getLogger("crow.pricing")

USAGE_TOTAL = "crow.usage_total"  # Session.state: the tokens of its calls since crow opened it

__all__ = [
    "PRICES_CHECKED",
    "USAGE_TOTAL",
    "add_cost",
    "call_ref",
    "cost_of",
    "known_cost",
    "list_price",
    "price_for",
    "record_usage",
]

# List prices of the vendors' own APIs (standard tier, prompts under any long-context
# surcharge), as (input, output, cache read, cache write). OpenAI does not charge cache
# writes. Sources: platform.openai.com/docs/pricing and
# platform.claude.com/docs/en/about-claude/pricing (cache write = the 5-minute rate).
PRICES_CHECKED = "2025-11-25"
_LIST: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "openai": {
        "gpt-5": (1.25, 10.0, 0.125, 1.25),
        "gpt-5.1": (1.25, 10.0, 0.125, 1.25),
        "gpt-5-mini": (0.25, 2.0, 0.025, 0.25),
        "gpt-5-nano": (0.05, 0.40, 0.005, 0.05),
        "gpt-4.1": (2.0, 8.0, 0.50, 2.0),
        "gpt-4.1-mini": (0.40, 1.60, 0.10, 0.40),
        "gpt-4.1-nano": (0.10, 0.40, 0.025, 0.10),
        "gpt-4o": (2.50, 10.0, 1.25, 2.50),
        "gpt-4o-2024-05-13": (5.0, 15.0, 5.0, 5.0),
        "gpt-4o-mini": (0.15, 0.60, 0.075, 0.15),
        "o1": (15.0, 60.0, 7.50, 15.0),
        "o3": (2.0, 8.0, 0.50, 2.0),
        "o3-mini": (1.10, 4.40, 0.55, 1.10),
        "o4-mini": (1.10, 4.40, 0.275, 1.10),
    },
    "anthropic": {
        "claude-opus-4-6": (5.0, 25.0, 0.50, 6.25),
        "claude-opus-4-5": (5.0, 25.0, 0.50, 6.25),
        "claude-opus-4-1": (15.0, 75.0, 1.50, 18.75),
        "claude-opus-4": (15.0, 75.0, 1.50, 18.75),
        "claude-opus-4-0": (15.0, 75.0, 1.50, 18.75),
        "claude-sonnet-4-6": (3.0, 15.0, 0.30, 3.75),
        "claude-sonnet-4-5": (3.0, 15.0, 0.30, 3.75),
        "claude-sonnet-4": (3.0, 15.0, 0.30, 3.75),
        "claude-sonnet-4-0": (3.0, 15.0, 0.30, 3.75),
        "claude-3-7-sonnet": (3.0, 15.0, 0.30, 3.75),
        "claude-haiku-4-5": (1.0, 5.0, 0.10, 1.25),
        "claude-3-5-haiku": (0.80, 4.0, 0.08, 1.0),
        "claude-3-haiku": (0.25, 1.25, 0.03, 0.30),
    },
}
# A dated snapshot or alias costs what its model costs: gpt-4o-2024-08-06, claude-sonnet-4-5-20250929.
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def model_name(model: str) -> str:
    """`model` without a snapshot date or `-latest`."""
    return _SNAPSHOT.sub("", model)


def list_price(provider: str, model: str) -> Pricing | None:
    table = _LIST.get(provider, {})
    prices = table.get(model) or table.get(model_name(model))
    if prices is None:
        return None
    i, o, r, w = prices
    return Pricing(input=i, output=o, cache_read=r, cache_write=w)


def call_ref(provider: Provider | None, request: ModelRequest | None) -> str:
    """`provider:model` of a call (a hook may have changed the request's model)."""
    if provider is None:
        return ""
    return f"{provider.name}:{(request.model if request is not None else '') or provider.model}"


def price_for(ref: str, config: Config | None) -> Pricing | None:
    """The price of `provider:model`: the config's (by ref, then by model name, as the
    provider's other settings), else the list price of the `openai` and `anthropic`
    providers' models (what those vendors charge; another provider serving a model of the
    same name need not charge that)."""
    provider, _, model = ref.partition(":")
    models = config.model_settings if config is not None else {}
    for key in (ref, model):
        settings = models.get(key)
        if settings is not None and settings.pricing is not None:
            return settings.pricing
    return list_price(provider, model)


def cost_of(usage: Usage, price: Pricing) -> float:
    """USD for one call's tokens (input excludes cached tokens, as crow.llm reports it)."""
    read = price.input if price.cache_read is None else price.cache_read
    write = price.input if price.cache_write is None else price.cache_write
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * read
        + usage.cache_write_tokens * write
    ) / 1_000_000


def known_cost(stored: object) -> float | None:
    """A stored total as crow wrote it, else None (unknown): a store edited by hand or
    damaged must not put NaN, a negative or a string on the wire."""
    if isinstance(stored, bool) or not isinstance(stored, (int, float)):
        return None
    return float(stored) if 0 <= stored < float("inf") else None


async def record_usage(session: Session, ref: str, usage: Usage | None) -> None:
    """A model call of the session's turn: what it reported becomes the base of the context
    estimate (when it reported usage), and its cost joins the session's total."""
    if usage is not None:
        session.last_usage, session.usage_covers = usage, len(session.messages)
    await add_cost(session, ref, usage)


async def add_cost(session: Session, ref: str, usage: Usage | None) -> None:
    """A call to `ref` (a turn's or a summary's) joins the session's stored total: None
    from now on when its price or its usage is unknown. Its tokens join the session's
    totals in this process (`USAGE_TOTAL`, not stored)."""
    if usage is not None:
        total = session.state.get(USAGE_TOTAL)
        session.state[USAGE_TOTAL] = usage if total is None else total + usage
    if session.cost is None:
        return  # unknown already: nothing to store
    price = price_for(ref, session.config)
    cost = None if price is None or usage is None else session.cost + cost_of(usage, price)
    if cost != session.cost:
        try:
            await session.save(cost=cost)
        except StoreError as exc:  # display-only: the next call's save stores the total
            log.warning("the cost of session %s was not stored: %s", session.id, exc)
