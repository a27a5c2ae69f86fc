"""Which responses infertune's Python-backend model sends for one request (no Triton import).

The engine hands every active sequence one token per step; what goes to the client depends on the
request and on how the model is told to behave (spec.py):

- streaming: a response once `stream_interval` tokens have accumulated since the last one (the
  first token at once, so TTFT is the first token's), and one with whatever is left at the end;
  not streaming: one response with the whole output at the end;
- each response carries the text of its tokens (`delta`) or all text so far (`cumulative`), and
  how many tokens it carries (sent as `num_output_tokens` when the request asked for it);
- the end: the last response flagged final (`flagged`), or the last response unflagged and then
  the final flag alone (`empty`), or no final at all (`none`: the caller holds the request).
"""

from __future__ import annotations

from dataclasses import dataclass

from infertune_tuner.triton_model.spec import StopSignal, TextMode


@dataclass(frozen=True)
class Send:
    """One send on the request's response sender."""

    tokens: int  # output tokens the response carries; 0: the final flag alone, no response
    text_from: int  # the text it carries: tokens [text_from, text_to) of the output
    text_to: int
    final: bool


@dataclass
class ResponsePlan:
    """One request's responses as its tokens come (see the module doc)."""

    streaming: bool = True
    interval: int = 1
    signal: StopSignal = "flagged"
    text: TextMode = "cumulative"
    sent: int = 0  # tokens already sent

    def on_token(self, generated: int, final: bool) -> list[Send]:
        """What to send now that the request has `generated` tokens (`final`: its last)."""
        if not self.streaming:
            return [Send(generated, 0, generated, True)] if final else []
        out: list[Send] = []
        new = generated - self.sent
        if new > 0 and (final or self.sent == 0 or new >= self.interval):
            start = self.sent if self.text == "delta" else 0
            out.append(Send(new, start, generated, final and self.signal == "flagged"))
            self.sent = generated
        if final and self.signal == "empty":
            out.append(Send(0, generated, generated, True))
        return out

    @property
    def holds_open(self) -> bool:
        """Whether the request is never completed by the model (`none`)."""
        return self.streaming and self.signal == "none"
