"""A stand-in for the Hugging Face Hub's HTTP API, for the real `huggingface_hub` client.

It answers what `snapshot_download` asks (huggingface_hub 1.x/2.x): the revision's commit, the
file tree, then HEAD + GET per file under `/{repo}/resolve/{commit}/{path}`; a repository marked
gated answers 401 with `X-Error-Code: GatedRepo` as the Hub does. Every request is recorded, so a
test sees what was downloaded. Point the client at it with HF_ENDPOINT.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]]
    gated: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    url: str = ""

    def downloaded(self, repo: str) -> list[str]:
        """Files of `repo` whose content was sent (GET), in order."""
        prefix = f"/{repo}/resolve/{COMMIT}/"
        return [
            p.removeprefix(prefix) for m, p in self.requests if m == "GET" and p.startswith(prefix)
        ]


def _handler(hub: FakeHub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            hub.requests.append((self.command, self.path))

        def _json(self, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _api(self) -> None:
            path = self.path.split("?", 1)[0].removeprefix("/api/models/")
            repo = "/".join(path.split("/")[:2])
            files = hub.repos.get(repo)
            if files is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.end_headers()
                return
            if "/tree/" in path:
                self._json([{"type": "file", "path": f, "size": len(d),
                             "oid": hashlib.sha1(d).hexdigest()} for f, d in files.items()])  # fmt: skip
            else:
                self._json({"id": repo, "sha": COMMIT,
                            "siblings": [{"rfilename": f} for f in files]})  # fmt: skip

        def _file(self, head: bool) -> None:
            repo, _, rest = self.path.lstrip("/").partition("/resolve/")
            name = rest.partition("/")[2]
            if repo in hub.gated:
                self.send_response(401)
                self.send_header("X-Error-Code", "GatedRepo")
                self.send_header("X-Error-Message", f"Access to model {repo} is restricted.")
                self.end_headers()
                return
            data = hub.repos.get(repo, {}).get(name)
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def do_HEAD(self) -> None:
            self._file(head=True)

        def do_GET(self) -> None:
            if self.path.startswith("/api/models/"):
                self._api()
            else:
                self._file(head=False)

    return Handler


@contextmanager
def serve(hub: FakeHub) -> Iterator[FakeHub]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
