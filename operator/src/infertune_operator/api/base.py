"""The base of every InferenceDeployment API model: the Kubernetes wire format."""

from __future__ import annotations

from pydantic import ConfigDict

from infertune_tuner.schema import Record, to_camel


class ApiModel(Record):
    """A Record with the Kubernetes wire format: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
        allow_inf_nan=False,  # .inf / .nan are no numbers a user means (the API server agrees)
    )

    def wire(self) -> dict[str, object]:
        """The camelCase dict a user would write (unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
