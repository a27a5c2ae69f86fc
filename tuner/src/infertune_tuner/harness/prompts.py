"""What a benchmark request sends: inputs negotiated from the model's metadata, synthetic prompts.

Triton rejects inputs a model does not declare, so the inputs come from its metadata: a
`text_input` string of `input_tokens` words (one token each, near enough) and, where declared,
`input_ids` INT32 token ids; the output length pinned through whichever of
`sampling_param_max_tokens` (LLM-API model), `max_tokens` (ensemble) or `request_output_len`
(engine model) exists; `streaming`/`stream`, `sampling_param_exclude_input_from_output` and
`exclude_input_in_output` set to true; `return_num_output_tokens` set to true where the model
also declares the `num_output_tokens` output (tokens.py). A model whose metadata cannot be read
gets `text_input` + `max_tokens`.

Requests are KServe v2 `ModelInferRequest` protobufs (protocol.py), each opting in to Triton's
empty final response.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.utils import serialize_byte_tensor

from infertune_tuner.errors import InputError
from infertune_tuner.harness.protocol import EMPTY_FINAL, ModelInferRequest
from infertune_tuner.harness.tokens import REQUEST_COUNT_INPUT, TokenSource

# fmt: off
WORDS = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "government",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "community", "name", "president", "team",
    "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change",
    "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force",
)
# fmt: on

MAX_TOKEN_INPUTS = ("sampling_param_max_tokens", "max_tokens", "request_output_len")
STREAMING_INPUTS = ("streaming", "stream")
# Boolean inputs that are set to true wherever a model declares them.
TRUE_INPUTS = (
    *STREAMING_INPUTS, "sampling_param_exclude_input_from_output", "exclude_input_in_output",
    REQUEST_COUNT_INPUT,
)  # fmt: skip
PER_REQUEST_INPUTS = frozenset({"text_input", "input_ids"})
# The KServe v2 data type each input is sent as; a model that declares another cannot be driven.
SENT_AS = {
    "text_input": "BYTES", "input_ids": "INT32", "input_lengths": "INT32",
    **{name: "INT32" for name in MAX_TOKEN_INPUTS}, **{name: "BOOL" for name in TRUE_INPUTS},
}  # fmt: skip


@dataclass(frozen=True)
class _Input:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 for the variable dimension


@dataclass
class RequestTemplate:
    """Which inputs to send, in which shapes (from ModelMetadata/ModelConfig)."""

    inputs: list[_Input]
    batched: bool = False
    metadata_error: str | None = None
    token_source: TokenSource = TokenSource.RESPONSES
    _words: list[str] = field(default_factory=lambda: list(WORDS))
    _cache: dict[tuple[int, int], _Prompts] = field(default_factory=dict)
    _shared: dict[tuple[str, int, int], tuple[Any, bytes]] = field(default_factory=dict)

    @classmethod
    def fallback(cls, error: str | None = None) -> RequestTemplate:
        return cls(
            [_Input("text_input", "BYTES", (-1,)), _Input("max_tokens", "INT32", (1,))],
            metadata_error=error,
        )

    @classmethod
    def from_metadata(cls, metadata: Any, max_batch_size: int) -> RequestTemplate:
        batched = max_batch_size > 0
        wanted: list[_Input] = []
        declared = {t.name: t for t in metadata.inputs}

        def add(name: str) -> None:
            t = declared[name]
            if t.datatype != SENT_AS[name]:
                raise InputError(
                    f"model {metadata.name!r} declares input {name!r} as {t.datatype}; the load "
                    f"generator sends it as {SENT_AS[name]}"
                )
            shape = tuple(int(d) for d in t.shape)
            if batched and shape:
                shape = shape[1:]  # metadata shows the batch dimension; we add it back as 1
            wanted.append(_Input(name, t.datatype, shape))

        for name in ("text_input", "input_ids", "input_lengths"):
            if name in declared:
                add(name)
        source = TokenSource.negotiate(set(declared), {t.name for t in metadata.outputs})
        for name in (*MAX_TOKEN_INPUTS, *TRUE_INPUTS):
            if name == REQUEST_COUNT_INPUT and source is not TokenSource.NUM_OUTPUT_TOKENS:
                continue
            if name in declared:
                add(name)
        if not any(i.name in ("text_input", "input_ids") for i in wanted):
            raise InputError(
                f"model {metadata.name!r} declares neither text_input nor input_ids; its inputs: "
                + ", ".join(sorted(declared))
            )
        return cls(wanted, batched=batched, token_source=source)

    def build(
        self, index: int, seed: int, input_tokens: int, output_tokens: int, model: str
    ) -> Any:
        """The `ModelInferRequest` of request `index` (request id = its index): a prompt no
        other request shares a prefix with (so prefix caching cannot shorten its prefill),
        cheap enough to build on the hot path; opted in to Triton's empty final response."""
        prompt = self._prompts(seed, input_tokens).make(index)
        tensors: list[Any] = []
        contents: list[bytes] = []
        for spec in self.inputs:
            if spec.name in PER_REQUEST_INPUTS:
                tensor, raw = self._input(
                    spec, self._value(spec, prompt, input_tokens, output_tokens)
                )
            else:
                key = (spec.name, input_tokens, output_tokens)
                shared = self._shared.get(key)  # identical in every request: build it once
                if shared is None:
                    value = self._value(spec, prompt, input_tokens, output_tokens)
                    shared = self._shared[key] = self._input(spec, value)
                tensor, raw = shared
            tensors.append(tensor)
            contents.append(raw)
        request = ModelInferRequest(
            model_name=model, id=str(index), inputs=tensors, raw_input_contents=contents
        )
        request.parameters[EMPTY_FINAL].bool_param = True
        return request

    def _input(self, spec: _Input, value: Any) -> tuple[Any, bytes]:
        """(the input tensor's metadata, its raw little-endian contents)."""
        shape = list(value.shape)
        if self.batched:
            shape = [1, *shape]
        if spec.datatype == "BYTES":
            raw = serialize_byte_tensor(value).item()
        else:
            raw = value.astype(value.dtype.newbyteorder("<")).tobytes()
        tensor = ModelInferRequest.InferInputTensor(
            name=spec.name, datatype=spec.datatype, shape=shape
        )
        return tensor, raw

    def _prompts(self, seed: int, input_tokens: int) -> _Prompts:
        key = (seed, input_tokens)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = _Prompts(seed, input_tokens, self._words)
        return cached

    def _value(self, spec: _Input, prompt: tuple[bytes, Any], isl: int, osl: int) -> Any:
        name = spec.name
        if name == "text_input":
            return np.array([prompt[0]], dtype=np.object_)
        if name == "input_ids":
            return prompt[1]
        if name == "input_lengths":
            return np.array([isl], dtype=np.int32)
        if name in MAX_TOKEN_INPUTS:
            return np.array([osl], dtype=np.int32)
        if name in TRUE_INPUTS:
            return np.array([True], dtype=bool)
        raise AssertionError(f"no value for input {name}")


class _Prompts:
    """Synthetic prompts of `tokens` words: a prefix of up to PREFIX words that encodes the
    request index (unique per request, so prefix caching cannot shorten a prefill), then a random
    body shared by all requests (built once). Cheap: no per-request random generator."""

    PREFIX = 8

    def __init__(self, seed: int, tokens: int, words: list[str]) -> None:
        rng = random.Random(f"body:{seed}:{tokens}")
        self.words = words
        self.prefix = min(self.PREFIX, tokens)
        self.offsets = [rng.randrange(len(words)) for _ in range(self.prefix)]
        body = rng.choices(words, k=tokens - self.prefix)
        self.body_text = ("" if not body else " " + " ".join(body)).encode()
        self.body_ids = np.array([rng.randrange(100, 30000) for _ in body], dtype=np.int32)

    def make(self, index: int) -> tuple[bytes, Any]:
        n = len(self.words)
        digits = [(index // n**k + off) % n for k, off in enumerate(self.offsets)]
        text = " ".join(self.words[d] for d in digits).encode() + self.body_text
        ids = np.concatenate([np.array(digits, dtype=np.int32) * 101 + 1000, self.body_ids])
        return text, ids
