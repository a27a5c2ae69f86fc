"""Kubernetes value formats the API checks as the API server would: names and quantities.

The CRD carries the same rules (patterns, and a CEL rule on ``metadata.name``), so a manifest
``infertune validate`` accepts is one ``kubectl apply`` accepts, and the messages agree.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

# metadata.name becomes the name of a Service, a Deployment, a Job and a ConfigMap (with
# suffixes): a DNS-1035 label (a letter first), short enough for the longest derived name.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH = 48
NAME_RULE = (
    "must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter) "
    f"of at most {NAME_MAX_LENGTH} characters"
)
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS-1123 label
NAMESPACE_RULE = (
    "must be a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a "
    "letter or digit) of at most 63 characters"
)


def label(pattern: str, max_length: int, rule: str) -> AfterValidator:
    def check(value: str) -> str:
        if len(value) > max_length or not re.fullmatch(pattern, value):
            raise ValueError(f"{value!r} {rule}")
        return value

    return AfterValidator(check)


# Kubernetes' quantity grammar (k8s.io/apimachinery/pkg/api/resource): a signed decimal number,
# then a binary-SI (Ki..Ei), decimal-SI (n, u, m, k, M..E) or exponent (e3, E-2) suffix.
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (such as 2, 500m or 16Gi)")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_quantity),  # one clear message instead of one per union member
    WithJsonSchema(
        {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": QUANTITY_PATTERN}]}
    ),
]
