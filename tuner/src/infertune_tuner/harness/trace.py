"""What the client saw of one streamed request (`RequestTrace`): the raw material of stats.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """What the client saw of one request.

    `responses` holds the arrival time of each response that carried output; `tokens` the output
    tokens each of those responses carried (None: one each, the streaming norm). `server` holds
    optional server-reported (received, first token, last token) times on the same clock.
    `stalled`: the stream went silent after some tokens without a final response, and the client
    gave up on it at `end_s` (a short request: not completed, no latency sample).
    """

    send_s: float
    responses: tuple[float, ...] = ()
    tokens: tuple[int, ...] | None = None
    error: str | None = None
    end_s: float | None = None  # when an errored or stalled request was given up
    server: tuple[float, float, float] | None = None
    stalled: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.stalled and bool(self.responses)

    @property
    def output_tokens(self) -> int:
        return sum(self.tokens) if self.tokens is not None else len(self.responses)

    @property
    def last_s(self) -> float:
        if self.responses:
            return self.responses[-1]
        return self.end_s if self.end_s is not None else self.send_s

    def ttft_s(self) -> float:
        return self.responses[0] - self.send_s

    def e2e_s(self) -> float:
        return self.responses[-1] - self.send_s

    def itl_s(self) -> float | None:
        """GenAI-Perf's inter-token latency of this request: (E2E - TTFT) / (tokens - 1)."""
        if len(self.responses) < 2 or self.output_tokens < 2:
            return None
        return (self.e2e_s() - self.ttft_s()) / (self.output_tokens - 1)

    def gaps_s(self) -> list[float]:
        """True inter-token gaps (k tokens in one response: k gaps of gap/k)."""
        out: list[float] = []
        r = self.responses
        counts = self.tokens
        if counts is not None and counts[0] > 1:
            out.extend([0.0] * (counts[0] - 1))  # tokens delivered together with the first
        for i in range(1, len(r)):
            k = counts[i] if counts is not None else 1
            if k <= 0:
                continue
            gap = (r[i] - r[i - 1]) / k
            out.extend([gap] * k)
        return out
