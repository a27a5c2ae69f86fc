"""Failure signatures: what a failed trial died of, and whether trying it again is worth it.

A failed trial's reason is free text (measurement.Measurement.reason): usually a context line the
tuner wrote ("the server exited before it was ready (exit code 1)", "the server was not ready
after 1800 s", "all 64 requests failed: ...") followed by the last lines of the server's log
(harness/runner.py, classify_failure). Its *signature* is the first line of that text that reads
as an error from the server or the system (`first_error_line`), with what differs between two
occurrences of one fault taken out (`normalise`: timestamps, log prefixes, ranks, addresses,
ids, pod names, directories, numbers), together with the phase the trial died in. Two failures
with the same signature share a cause; the search tells them from unrelated ones by it.

Some failures say nothing about the configuration: the pod was evicted, its node was lost or
preempted, a connection was reset, the weights download timed out, the model did not finish
loading within the startup timeout. Run elsewhere, the same configuration is likely to succeed,
so the search re-runs such a *transient* failure once before it counts against the
configuration. Every other failure is *structural* (an unsupported quantization on this GPU, a
missing checkpoint, an engine that cannot be built or loaded, NCCL that cannot initialise):
running it again fails the same way. CUDA out of memory is neither: the runner records it with
status "oom", and it is judged as such.

A failure is transient when any line of its reason matches a row, not only its first error
line: the tuner's own context line may be the evidence (a load that timed out), and a notice
of eviction may follow the server's last words. A row may hold only in some phases (a Hub
timeout while downloading weights, not the benchmark's own timeouts); a failure whose phase is
not known is judged by its lines alone.

`TRANSIENT` below is the one table of transient kinds; every other module asks this one. Each
row quotes a real line of its kind and says where it came from; tests/tuner_tests/
test_signatures.py checks every row against its own line and against real structural lines.
The table stays narrow on purpose: a structural failure taken for a transient one costs one
extra trial, but a pattern loose enough to match the server's ordinary noise would re-run
everything.

Pure: no I/O, nothing beyond the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_TEXT = 160  # a signature's text is cut to this many characters


@dataclass(frozen=True)
class Transient:
    """One kind of failure that says nothing about the configuration (a row of `TRANSIENT`)."""

    name: str
    pattern: re.Pattern[str]  # searched in every line of a reason
    # The phases (measurement.TrialPhase) it counts in; None: any. A failure whose phase is not
    # known (None: a simulated trial, a record from before phases were kept) is judged by its
    # lines alone: every pattern is specific enough to stand without the phase.
    phases: frozenset[str] | None
    source: str  # where `example` came from: an upstream issue or file, or this project's code
    example: str  # a real line of this kind, verbatim


def _row(
    name: str, pattern: str, source: str, example: str, phases: Iterable[str] | None = None
) -> Transient:
    return Transient(
        name=name,
        pattern=re.compile(pattern),
        phases=None if phases is None else frozenset(phases),
        source=source,
        example=example,
    )


# In order: the first row whose pattern matches any line of a reason names the transient kind.
TRANSIENT: tuple[Transient, ...] = (
    # The kubelet evicts pods from a node short of memory, disk or PIDs (status.reason "Evicted";
    # the message formats are in kubernetes/kubernetes pkg/kubelet/eviction/helpers.go). The node
    # was short, not the configuration: the pod is a candidate on any other node.
    _row(
        "pod evicted",
        r"(?i:\bpod evicted\b)|The node was low on resource: |The node had condition: "
        r"|(?i:\breason\b)[\s:='\"]*Evicted\b",
        "https://github.com/FederatedAI/KubeFATE/issues/64",
        "4m11s       Warning   Evicted               pod/egg-<id here>    The node was low on "
        "resource: memory. Container egg was using 5053216Ki, which exceeds its request of 0.",
    ),
    # The node controller gives up on a node whose kubelet stopped reporting and marks its pods
    # (kubernetes/kubernetes pkg/util/node/node.go: NodeUnreachablePodReason "NodeLost",
    # NodeUnreachablePodMessage "Node %v which was running pod %v is unresponsive").
    _row(
        "node lost",
        r"\bNodeLost\b|(?i:\bnode lost\b)|\bwhich was running pod \S+ is unresponsive\b",
        "https://github.com/kubernetes/kubernetes/issues/61263",
        "message: Node ubuntu-1604-001 which was running pod mysql-0 is unresponsive",
    ),
    # The node controller's event when a node stops posting status (node_lifecycle_controller).
    _row(
        "node not ready",
        r"\bNodeNotReady\b|(?i:\bnode\b[^.;]{0,80}\bnot ready\b)",
        "https://github.com/kubernetes/minikube/issues/6822",
        'I0217 14:41:37.439852       1 event.go:281] Event(v1.ObjectReference{Kind:"Node", '
        'Namespace:"", Name:"docker2", UID:"c9105832-6226-4027-8250-447fab204fe7", '
        'APIVersion:"", ResourceVersion:"", FieldPath:""}): type: \'Normal\' reason: '
        "'NodeNotReady' Node docker2 status is now: NodeNotReady",
    ),
    # A pod stopped to make room for a more important one, or because its node shuts down
    # (spot/preemptible nodes): the kubelet's messages (pkg/kubelet/preemption/preemption.go,
    # pkg/kubelet/nodeshutdown) and the scheduler's DisruptionTarget condition, which Kubernetes
    # sets so that a Job can retry such a pod without counting it as failed (KEP-3329).
    _row(
        "preempted",
        r"Preempted in order to admit critical pod|preempting to accommodate a higher priority"
        r"|\bPreemptionByScheduler\b|\bPreempted by \S+ on node\b"
        r"|Pod was terminated in response to imminent node shutdown",
        "https://github.com/kubernetes/kubernetes/blob/master/pkg/kubelet/preemption/preemption.go",
        "Preempted in order to admit critical pod",
    ),
    # gRPC status 14 (UNAVAILABLE) with the connection reset under it, in the forms of Go
    # ("rpc error: code = Unavailable desc = ...") and of the Python client tritonclient wraps
    # ("[StatusCode.UNAVAILABLE] ...", debug_error_string ... "grpc_status":14). gRPC documents
    # UNAVAILABLE as "most likely a transient condition, which can be corrected by retrying"
    # (grpc/grpc doc/statuscodes.md). A bare "Connection reset by peer" is not enough: Triton's
    # HTTP front end logs one whenever a client hangs up.
    _row(
        "connection reset",
        r"(?i:\bunavailable\b.*\bconnection reset by peer\b"
        r"|\bconnection reset by peer\b.*\bgrpc_status\W{1,3}14\b)",
        "https://github.com/grpc/grpc/issues/26731",
        'debug_error_string = "{"created":"@1626692243.576262296","description":"Error '
        'received from peer ipv4:172.20.64.67:9010","file":"src/core/lib/surface/call.cc",'
        '"file_line":1066,"grpc_message":"Connection reset by peer","grpc_status":14}"',
    ),
    # gRPC found no address it could connect to: the client's "[StatusCode.UNAVAILABLE] failed
    # to connect to all addresses", or Triton's Python-backend stub. In the issue below the same
    # model failed to load with it, then loaded on the next try.
    _row(
        "cannot connect",
        r"(?i:\bfailed to connect to all addresses\b)",
        "https://github.com/triton-inference-server/server/issues/3147",
        "triton-srv    | E0723 03:46:11.726061 1 model_repository_manager.cc:1242] failed to "
        "load 'DEVELOPED_MODEL' version 1: Internal: failed to connect to all addresses",
    ),
    # NCCL gave up connecting a socket to a peer: it retries ECONNREFUSED, ETIMEDOUT and
    # EHOSTUNREACH itself before it warns (NVIDIA/nccl src/os/linux.cc, socketConnectCheck), so
    # upstream treats them as transient; a network that stays down on this node is another
    # node's chance. Not "Connection closed by remote peer": NCCL's maintainers read that as the
    # peer having exited (NVIDIA/nccl#1486, #795), i.e. an echo of the peer's own error.
    _row(
        "nccl connect",
        r"NCCL WARN\b.*\b[Cc]onnect to \S+ (?:returned|failed)\b.*"
        r"\b(?:No route to host|Connection refused|Connection timed out)\b",
        "https://github.com/sgl-project/sglang/issues/3820",
        "node5:240:240 [6] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to "
        "10.0.0.4<56849> returned 113(No route to host) errno 115(Operation now in progress)",
    ),
    # The Hugging Face Hub timed out. huggingface_hub retries timeouts and network errors itself
    # (utils/_http.py, http_backoff); a download that still failed is the Hub's or the network's
    # bad minute. Only while downloading weights: the benchmark's own timeouts are the server's.
    _row(
        "hub timeout",
        r"(?i)^(?=.*(?:huggingface\.co|\bhf\.co\b|huggingface_hub|\bHfHub|^cannot download\b))"
        r"(?=.*(?:timed out|\bReadTimeout|\bConnectTimeout|\bIncompleteRead|RemoteProtocolError"
        r"|connection reset by peer))",
        "https://github.com/huggingface/huggingface_hub/issues/1718",
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='cdn-lfs.huggingface.co', "
        "port=443): Read timed out.",
        phases=("downloading weights",),
    ),
    # The Hub answered 408, 429 or a 5xx: huggingface_hub retries exactly these statuses
    # (utils/_http.py, _DEFAULT_RETRY_ON_STATUS_CODES), and the report below ends "it's back up
    # now". 401, 403 and 404 (a gated or missing repository) are structural.
    _row(
        "hub server error",
        r"(?i)^(?=.*(?:huggingface\.co|\bhf\.co\b|huggingface_hub|\bHfHub|^cannot download\b))"
        r"(?=.*\b(?:408|429|50[0234]) (?:Client |Server )?Error\b)",
        "https://github.com/huggingface/transformers/issues/15487",
        "502 Server Error: Bad Gateway for url: "
        "https://huggingface.co/distilbert-base-uncased/resolve/main/config.json",
        phases=("downloading weights",),
    ),
    # The tuner's own line (harness/runner.py, _drive) when the server is alive but its model is
    # not ready within the startup timeout: a slow disk, a busy node, a cold cache. A server that
    # fails to load exits instead ("the server exited before it was ready").
    _row(
        "load timed out",
        r"^the server was not ready after \d+(?:\.\d+)? s\b",
        "tuner/src/infertune_tuner/harness/runner.py",
        "the server was not ready after 1800 s",
        phases=("loading model",),
    ),
)


@dataclass(frozen=True)
class Signature:
    """What a failed trial died of: equal signatures, one cause."""

    text: str  # the normalised first error line, at most MAX_TEXT characters ("" without one)
    phase: str | None  # the phase it died in (None: not known)
    transient: str | None  # the TRANSIENT row's name that matched, else None (structural)

    @property
    def is_transient(self) -> bool:
        return self.transient is not None

    def label(self) -> str:
        """Human text for reports: "loading model: <text>" ("<text>" without a phase), and
        " (transient: NAME)" after it when transient."""
        text = self.text or "no reason recorded"
        out = f"{self.phase}: {text}" if self.phase else text
        return f"{out} (transient: {self.transient})" if self.transient else out


def signature(reason: str | None, phase: str | None = None) -> Signature:
    """The signature of a failure with this reason, in this phase."""
    if not reason or not reason.strip():
        return Signature("", phase, None)
    return Signature(normalise(first_error_line(reason)), phase, _transient(reason, phase))


def _transient(reason: str, phase: str | None) -> str | None:
    """The first TRANSIENT row that allows `phase` and matches any line of `reason`."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    for row in TRANSIENT:
        if row.phases is not None and phase is not None and phase not in row.phases:
            continue
        if any(row.pattern.search(line) for line in lines):
            return row.name
    return None


# ------------------------------------------------------------------ the first error line
# A line that reads as an error from the server or the system.
_ERROR = re.compile(
    r"\[TensorRT-LLM\]\[ERROR\]|\bERROR\b|\[E\]|\b\w*Error(?=[:\s\]]|$)|Exception\b"
    r"|Assertion failed|\bassertion\b.*\bfailed\b|\bNCCL (?:WARN|error)\b|\bCUDA (?:runtime )?error"
    r"|\bfailed to load\b|\bSegmentation fault\b|\bcore dumped\b"
    r"|(?:^|[\s|])[EF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s"  # glog error and fatal lines
)
# Lines that are only log noise: info and warning lines, stack frames, the C++ runtime's
# announcement before the message it throws ("terminate called ..."; `what():` follows).
_NOISE = re.compile(
    r"(?:^|[\s|])[IW]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s"  # glog info and warning lines
    r"|\[TensorRT-LLM\]\[(?:INFO|WARNING|DEBUG|VERBOSE)\]|\[TRT(?:-LLM)?\]\s*(?:\[RANK \d+\]\s*)?"
    r"\[[IWV]\]|\bNCCL INFO\b|^\d+\s+0x[0-9a-f]+\s|^\[[\w.-]+:\d+\] (?:\[ ?\d+\]|\*\*\*)"
    r"|^terminate called after throwing an instance of"
    r"|^(?:\[[^\]]*\d{2}:\d{2}:\d{2}[^\]]*\]\s*)?(?:WARNING|INFO|DEBUG)\b",
)
_TRACEBACK = re.compile(r"\bTraceback \(most recent call last\):")
_RANK_PREFIX = re.compile(r"^\s*\[(?:rank|RANK) ?\d+\]:? ?")


def first_error_line(reason: str) -> str:
    """The line of `reason` a signature is built from: the first that reads as an error from
    the server or the system (for a Python traceback, the exception line that ends it), else
    the first line that is not log noise (the tuner's context line), else the first line."""
    raw = reason.splitlines()
    lines = [line.strip() for line in raw]
    for i, line in enumerate(lines):
        if not line or _NOISE.search(line):
            continue
        if _TRACEBACK.search(line):
            exception = _traceback_exception(raw, i)
            if exception:
                return exception
            continue
        if _ERROR.search(line):
            return line
    for line in lines:
        if line and not _NOISE.search(line) and not _TRACEBACK.search(line):
            return line
    return next((line for line in lines if line), "")


def _traceback_exception(raw: list[str], start: int) -> str:
    """The line that ends the traceback starting at raw[start]: the first one after it that is
    not indented (its frames are), under the rank marker a line may carry."""
    for line in raw[start + 1 :]:
        body = _RANK_PREFIX.sub("", line, count=1)
        if not body.strip() or body[:1] in (" ", "\t") or _TRACEBACK.search(body):
            continue
        return line.strip()
    return ""


# ------------------------------------------------------------------ normalising a line
_TRT_LLM_TAG = "[TensorRT-LLM][ERROR]"
_GLOG = re.compile(r"\b[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+\s+[\w.-]+:\d+\]\s*")
_STAMP = re.compile(
    r"\[[^\]\[]*\d{1,2}:\d{2}:\d{2}[^\]\[]*\]"  # [04/09/2024-16:26:41], [2025-02-24 14:09:34 TP1]
    r"|\b\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"
)
_RANK = re.compile(r"\[(?:rank|RANK) ?\d+\]:?")
_NCCL_HOST = re.compile(r"^\S+:\d+:\d+ \[\d+\] ")  # NCCL's "host:pid:tid [device] "
_COMPOSE = re.compile(r"^[\w.-]+\s*\| ")  # a log collector's "service-1  | "
_URL = re.compile(r"\b([a-z][a-z0-9+.-]*://[^/\s'\"]+)/(?:[^\s'\")]*/)?([^\s'\"/)]*)")
_PATH = re.compile(r"(?<![\w/.:<-])(?:\.{1,2}/|/)(?:[\w.@+-]+/)*(?=[\w@+-])")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_IPV6 = re.compile(
    r"(?<![\w:.])(?=[0-9a-fA-F:.]*::|(?:[0-9a-fA-F]{1,4}:){4})(?=[:.]*[0-9a-fA-F])"
    r"(?:[0-9a-fA-F]{0,4}:){2,7}(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F]{0,4})(?:%\w+)?(?![\w.:])"
)
_IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b")
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b")
_NAME = re.compile(r"(?<![\w.-])[a-z0-9][a-z0-9-]*[a-z0-9](?![\w-])")
# A number on its own, not one inside a name: FP8, SM90, W4A16 and bf16 name what failed.
_NUMBER = re.compile(r"(?<![A-Za-z_\d])\d+(?:\.\d+)*(?![A-Za-z_\d])")
_SPACE = re.compile(r"\s+")


def normalise(line: str) -> str:
    """`line` without what differs between two occurrences of one fault: what precedes
    TensorRT-LLM's error tag (how the error travelled: a Python exception, Triton's load report,
    the C++ runtime's `what():`), timestamps and log prefixes (a log collector's "service |",
    glog, bracketed dates, NCCL's host:pid:tid, rank markers), the directories of URLs and paths
    (the basename stays), UUIDs, IPv4 and IPv6 addresses with their ports, generated pod and node
    names (<pod>), hex numbers, and every other number on its own (#: a number inside a name,
    FP8, SM90, W4A16, stays); whitespace collapsed, at most
    MAX_TEXT characters."""
    text = line
    if _TRT_LLM_TAG in text:  # the innermost, when an exception's text repeats the tag
        text = text[text.rindex(_TRT_LLM_TAG) :]
    text = _COMPOSE.sub("", text.strip())
    text = _GLOG.sub("", text)
    text = _STAMP.sub("", text)
    text = _RANK.sub("", text)
    text = _NCCL_HOST.sub("", text.strip())
    text = _URL.sub(lambda m: f"{m.group(1)}/.../{m.group(2)}", text)
    text = _PATH.sub("", text)
    text = _UUID.sub("<uuid>", text)
    text = _IPV6.sub("<ip>", text)
    text = _IPV4.sub("<ip>", text)
    text = _NAME.sub(lambda m: "<pod>" if _generated_name(m.group(0)) else m.group(0), text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("#", text)
    return _SPACE.sub(" ", text).strip()[:MAX_TEXT]


def _generated_name(token: str) -> bool:
    """Whether `token` looks like a name Kubernetes or a cloud made up: a hyphenated name that
    ends in a random suffix (tuner-abc12-xyz9k, istio-citadel-894d98c88-zkt23, k8s-node2),
    not a model size (llama-70b)."""
    parts = token.split("-")
    if len(parts) < 2:
        return False
    last = parts[-1]
    if 4 <= len(last) <= 5 and _mixed(last) and not re.fullmatch(r"\d+[a-z]", last):
        return True
    return len(parts) >= 3 and len(last) == 5 and 6 <= len(parts[-2]) <= 10 and _mixed(parts[-2])


def _mixed(word: str) -> bool:
    return any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
