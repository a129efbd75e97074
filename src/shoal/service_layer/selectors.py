"""Service selectors as Nacos parses and applies them (SelectorManager, NoneSelector, LabelSelector;
docs/protocol.md §3.9).

A service's ``selector`` is ``{"type":"none"}`` or ``{"type":"label","expression":...}``. A label
expression is Nacos's ExpressionInterpreter grammar: whitespace ignored, terms
``CONSUMER.label.<name>=PROVIDER.label.<name>`` (the same name on both sides) joined by ``&``;
blank means no labels. A selector that does not parse is refused (400, ``Selector parses
failed: parse expression failed!``) when the service is created or updated.

Applying it: Nacos's LabelSelector keeps the providers whose CMDB labels equal the consumer's for
every label, and when none matches answers every provider. The labels come from the CMDB (the
entity of each IP); a node without a CMDB plugin has no entity for any IP, so no provider ever
matches and the answer is every provider. Shoal has no CMDB, so a label selector selects every
instance, exactly as a stock Nacos does; it is parsed, kept and shown in Nacos's shape
(``{"labels":[...],"expression":...,"type":"label","contextType":"CMDB"}``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shoal.errors import InvalidParam

CONSUMER_PREFIX = "CONSUMER.label."
PROVIDER_PREFIX = "PROVIDER.label."
PARSE_FAILED = "Selector parses failed: parse expression failed!"
NONE_SELECTOR = {"type": "none", "contextType": "NONE"}

_WHITESPACE = re.compile(r"\s+")


def label_names(expression: str | None) -> list[str]:
    """The label names of a label expression (sorted, each once); InvalidParam if it does not parse."""
    if expression is None:
        return []
    expression = _WHITESPACE.sub("", expression)
    if not expression:
        return []
    names = set()
    for term in expression.split("&"):
        consumer, sep, provider = term.partition("=")
        if not sep or not consumer.startswith(CONSUMER_PREFIX) or not provider.startswith(PROVIDER_PREFIX):
            raise InvalidParam(PARSE_FAILED)
        name = consumer[len(CONSUMER_PREFIX):]
        if not name or "=" in provider or provider[len(PROVIDER_PREFIX):] != name:
            raise InvalidParam(PARSE_FAILED)
        names.add(name)
    return sorted(names)


def normalise_selector(selector: Mapping[str, Any]) -> dict[str, Any]:
    """A ``none`` or ``label`` selector (type matched case-insensitively) in the shape Nacos keeps
    and shows; InvalidParam for another type or an expression that does not parse."""
    kind = selector.get("type")
    kind = kind.lower() if isinstance(kind, str) else None
    if kind == "none":
        return dict(NONE_SELECTOR)
    if kind != "label":
        raise InvalidParam("Param 'selector' must be a JSON object with type 'none' or 'label'.")
    expression = selector.get("expression")
    if expression is not None and not isinstance(expression, str):
        raise InvalidParam(PARSE_FAILED)
    return {"labels": label_names(expression), "expression": expression, "type": "label", "contextType": "CMDB"}
