"""The one base of infertune's data models, and the helpers every model module shares.

Every pydantic model (the tuning request, the report, the InferenceDeployment API) is a
:class:`Record`: unknown fields are an error, so a typo never passes silently, and a value is
immutable once built. The API models add their camelCase wire format on top (``ApiModel``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, create_model

M = TypeVar("M", bound=BaseModel)


class Record(BaseModel):
    """Unknown fields rejected, immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def to_camel(snake: str) -> str:
    """``e2e_latency_ms`` -> ``e2eLatencyMs`` (pydantic's own would give ``e2ELatencyMs``)."""
    first, *rest = snake.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def with_fields(fields: Mapping[str, tuple[Any, Any]]) -> Callable[[type[M]], type[M]]:
    """Class decorator: the model plus ``fields`` (name -> (type, default or ``Field``)).

    For field sets that come from a registry (one field per metric of ``metrics.py``): the class
    body declares what every instance has, the registry adds one field per entry, and code reads
    those fields through the registry's accessors rather than by name.
    """

    def add(cls: type[M]) -> type[M]:
        built: type[M] = create_model(  # type: ignore[call-overload]
            cls.__name__,
            __base__=cls,
            __module__=cls.__module__,
            __doc__=cls.__doc__,
            **dict(fields),
        )
        built.__qualname__ = cls.__qualname__
        return built

    return add
