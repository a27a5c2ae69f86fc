"""The API server's pod proxy in the emulator: ``GET /api/v1/namespaces/NS/pods/POD:PORT/proxy/PATH``
reaches what a test registered for that pod and port (a serving pod's metrics endpoint), as
kube-apiserver reaches the pod's IP. A pod nobody registered is 503, as when the API server
cannot reach a pod."""

from __future__ import annotations

import re

import aiohttp
import aiohttp.web

_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+):(\d+)/proxy/(.*)$")


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip
    return aiohttp.web.json_response(body, status=code)


async def forward(proxies: dict[tuple[str, str, int], str], path: str) -> aiohttp.web.Response:
    match = _PATH.match(path)
    if match is None:
        return _status(404, "NotFound", f"the server could not find the requested resource {path}")
    namespace, pod, port, rest = match.groups()
    target = proxies.get((namespace, pod, int(port)))
    if target is None:
        return _status(503, "ServiceUnavailable", f'error trying to reach service: pod "{pod}"')
    try:
        async with aiohttp.ClientSession() as session, session.get(f"{target}/{rest}") as resp:
            text = await resp.text()
            return aiohttp.web.Response(text=text, status=resp.status, content_type="text/plain")
    except aiohttp.ClientError as exc:
        return _status(503, "ServiceUnavailable", f"error trying to reach service: {exc}")
