"""Failure signatures, checked on real error lines: what counts as transient (re-run once) and
what is structural, and which failures share a signature (signatures.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from infertune_tuner.harness.runner import classify_failure
from infertune_tuner.measurement import TrialPhase
from infertune_tuner.signatures import (
    MAX_TEXT,
    TRANSIENT,
    Signature,
    Transient,
    first_error_line,
    normalise,
    signature,
)

REPO = Path(__file__).resolve().parents[2]

# Lines the project's simulated failures use verbatim: (line, phase, the transient kind).
REQUIRED_TRANSIENT = [
    ("the server was not ready after 1800 s", "loading model", "load timed out"),
    ("rpc error: code = Unavailable desc = connection reset by peer", None, "connection reset"),
    (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi.",
        None,
        "pod evicted",
    ),
    ("pod evicted: node lost", None, "pod evicted"),
]
# ... and structural ones, four causes.
REQUIRED_STRUCTURAL = [
    "[TensorRT-LLM][ERROR] Assertion failed: Unsupported quantization mode for W4A16 AWQ on SM90"
    " (weightOnlyGemm)",
    "NCCL error in: /src/nccl/init.cc:1234, unhandled system error (run with NCCL_DEBUG=INFO for"
    " details)",
    "[TensorRT-LLM][ERROR] FP8 KV cache is not supported with this attention backend",
    "RuntimeError: max_batch_size 256 exceeds the engine's build-time limit of 128",
]

# More real transient lines, verbatim: (line, phase, the kind it is).
REAL_TRANSIENT = [
    # https://github.com/Greenstand/treetracker-infrastructure/issues/49 (kubectl describe pod)
    ("Reason:         Evicted", None, "pod evicted"),
    # https://github.com/FederatedAI/KubeFATE/issues/64 (an event)
    (
        "4m7s        Warning   Evicted               pod/egg-<id2 here>    The node had "
        "condition: [MemoryPressure].",
        None,
        "pod evicted",
    ),
    # https://github.com/kubernetes/website/blob/main/content/en/docs/concepts/cluster-administration/node-shutdown.md
    (
        "Message:        Pod was terminated in response to imminent node shutdown.",
        None,
        "preempted",
    ),
    # https://github.com/isarsoft/yolov4-triton-tensorrt/issues/70 (tritonclient)
    (
        "tritonclient.utils.InferenceServerException: [StatusCode.UNAVAILABLE] failed to connect "
        "to all addresses",
        "measuring",
        "cannot connect",
    ),
    # https://github.com/unslothai/unsloth/issues/3486
    (
        "'(ReadTimeoutError(\"HTTPSConnectionPool(host='huggingface.co', port=443): Read timed "
        "out. (read timeout=10)\"), '(Request ID: 7d76f590-4653-46a3-8cec-2473bc91d595)')' "
        "thrown while requesting HEAD https://huggingface.co/unsloth/Qwen2.5-7B-Instruct-bnb-4bit/"
        "resolve/main/model.safetensors.index.json",
        "downloading weights",
        "hub timeout",
    ),
    # https://github.com/huggingface/transformers/issues/23228
    (
        "HTTPError: 504 Server Error: Gateway Time-out for url: https://huggingface.co/api/models/"
        "bert-base-uncased/tree/main?recursive=True",
        "downloading weights",
        "hub server error",
    ),
    # https://github.com/huggingface/huggingface_hub/issues/1211
    (
        "requests.exceptions.HTTPError: 500 Server Error: Internal Server Error for url: "
        "https://huggingface.co/api/models",
        "downloading weights",
        "hub server error",
    ),
]

# Real structural lines, verbatim, each with the cause it names: lines with one cause id are
# the same fault reported twice (another build's paths, another process, another moment).
REAL_STRUCTURAL: list[tuple[str, str]] = [
    # https://github.com/NVIDIA/TensorRT-LLM/issues/199 (fused MHA on a GPU it has no kernel for)
    (
        "[TensorRT-LLM][ERROR] Assertion failed: Unsupported architecture (/src/tensorrt_llm/cpp/"
        "tensorrt_llm/kernels/contextFusedMultiHeadAttention/fmhaRunner.cpp:87)",
        "fmha arch",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/320 (the same, from another build's tree)
    (
        "[TensorRT-LLM][ERROR] Assertion failed: Unsupported architecture (/home/build/"
        "TensorRT_LLM/TensorRT-LLM-master/cpp/tensorrt_llm/kernels/"
        "contextFusedMultiHeadAttention/fmhaRunner.cpp:87)",
        "fmha arch",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/95 (the same, thrown through the C++ runtime)
    (
        "  what():  [TensorRT-LLM][ERROR] Assertion failed: Unsupported architecture (/src/"
        "tensorrt_llm/cpp/tensorrt_llm/kernels/contextFusedMultiHeadAttention/fmhaRunner.cpp:87)",
        "fmha arch",
    ),
    # https://github.com/Tlntin/Qwen-TensorRT-LLM/issues/15 (weight-only int8 on a P40)
    (
        "RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: Unsupported Arch (/opt/tritonserver/"
        "TensorRT-LLM/cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp:147)",
        "cutlass arch",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/2855 (FP8 FMHA on an unsupported SM)
    (
        "  what():  [TensorRT-LLM][ERROR] Assertion failed: FP8 FMHA cannot be enabled except on "
        "Ada or Hopper or Blackwell Arch. (/code/tensorrt_llm/cpp/tensorrt_llm/common/"
        "attentionOp.cpp:2357)",
        "fp8 fmha arch",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/5581 (FP8 block-scaled GEMM on an RTX 6000)
    ("Unsupported SM version for FP8 block scaling GEMM", "fp8 block gemm sm"),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/2229 (FP8 rowwise on SM89)
    (
        "[TensorRT-LLM Error][CutlassFp8RowwiseGemmRunner][GEMM Dispatch] Arch unsupported for "
        "CUTLASS gated GEMM",
        "fp8 rowwise arch",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/1428 (engine build: FP8 on an A100)
    (
        "[04/09/2024-16:26:41] [TRT] [E] 9: [standardEngineBuilder.cpp::buildEngine::2266] Error "
        "Code 9: Internal Error (Networks with FP8 precision require hardware with FP8 support.)",
        "fp8 engine build",
    ),
    (
        "[04/09/2024-16:26:41] [TRT-LLM] [E] Engine building failed, please check the error log.",
        "engine build failed",
    ),
    # https://github.com/triton-inference-server/tensorrtllm_backend/issues/424 (an engine built
    # by another TensorRT; Triton's model table calls the model UNAVAILABLE)
    (
        "| tensorrt_llm     | 1       | UNAVAILABLE: Internal: unexpected error when creating "
        "modelInstanceState: [TensorRT-LLM][ERROR] Assertion failed: Failed to deserialize cuda "
        "engine (/tmp/tritonbuild/tensorrtllm/tensorrt_llm/cpp/tensorrt_llm/runtime/tllm |",
        "engine deserialize",
    ),
    # https://github.com/triton-inference-server/tensorrtllm_backend/issues/531
    (
        "Serialization assertion stdVersionRead == kSERIALIZATION_VERSION failed.Version tag does "
        "not match. Note: Current Version: 228, Serialized Engine Version: 237",
        "engine version",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/1749 (a plugin the engine was built with
    # does not deserialize in this runtime)
    (
        "[TensorRT-LLM][ERROR] tensorrt_llm::common::TllmException: [TensorRT-LLM][ERROR] "
        "Assertion failed: sizeof(T) <= remaining_buffer_size (/home/jenkins/agent/workspace/LLM/"
        "main/L0_PostMerge/tensorrt_llm/cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/"
        "decoderXQAImplJIT/serializationUtils.h:32)",
        "plugin deserialize",
    ),
    # https://github.com/triton-inference-server/server/issues/6950 and
    # https://github.com/triton-inference-server/tensorrtllm_backend/issues/363: one fault, two
    # ranks of one launch (glog time and thread differ)
    (
        "E0305 19:29:57.029880 119 backend_model.cc:634] ERROR: Failed to create instance: "
        "unexpected error when creating modelInstanceState: [TensorRT-LLM][ERROR] CUDA runtime "
        "error in cudaDeviceGetDefaultMemPool(&memPool, device): operation not supported "
        "(/app/tensorrt_llm/cpp/tensorrt_llm/runtime/bufferManager.cpp:170)",
        "mempool unsupported",
    ),
    (
        "E0305 19:29:57.373556 116 backend_model.cc:634] ERROR: Failed to create instance: "
        "unexpected error when creating modelInstanceState: [TensorRT-LLM][ERROR] CUDA runtime "
        "error in cudaDeviceGetDefaultMemPool(&memPool, device): operation not supported "
        "(/app/tensorrt_llm/cpp/tensorrt_llm/runtime/bufferManager.cpp:170)",
        "mempool unsupported",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/1803 (Triton failed to load the model: its
    # config lacks a key this backend needs)
    (
        'triton-models-1  | E0618 08:11:13.251518 1 model_lifecycle.cc:641] "failed to load '
        "'tensorrt_llm' version 1: Internal: unexpected error when creating modelInstanceState: "
        "[json.exception.out_of_range.403] key 'use_context_fmha_for_generation' not found\"",
        "config key",
    ),
    # https://github.com/triton-inference-server/tensorrtllm_backend/issues/281 (an OOM while
    # loading, reported through an UNAVAILABLE model: status "oom", never a transient)
    (
        "Model 'tensorrt_llm' loading failed with error: version 1 is at UNAVAILABLE state: "
        "Internal: unexpected error when creating modelInstanceState: [TensorRT-LLM][ERROR] CUDA "
        "runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory "
        "(/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)",
        "oom",
    ),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/9263 (NCCL init: two ranks on one GPU)
    (
        "RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: Failed, NCCL error ../tensorrt_llm/"
        "runtime/ncclCommunicator.cpp:90 'invalid usage (run with NCCL_DEBUG=WARN for details)'",
        "nccl invalid usage communicator",
    ),
    # https://github.com/triton-inference-server/tensorrtllm_backend/issues/170 (its title)
    (
        "NCCL error /app/tensorrt_llm/cpp/tensorrt_llm/plugins/ncclPlugin/sendPlugin.cpp:129 "
        "'invalid usage (run with NCCL_DEBUG=WARN for details)'",
        "nccl invalid usage send",
    ),
    # https://github.com/NVIDIA/nccl/issues/207 (its title)
    (
        "NCCL error in: /torch/lib/c10d/ProcessGroupNCCL.cpp:260, unhandled system error",
        "nccl system error",
    ),
    # https://github.com/NVIDIA/nccl/issues/975 (ECONNABORTED: NCCL does not retry it; a
    # firewall, NVIDIA/nccl-tests#162)
    (
        "n122-246-085:12251:12400 [5] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to "
        "fe80::966d:ae03:a2:8cf0%ib1<17943> failed : Software caused connection abort",
        "nccl connection abort",
    ),
    # https://github.com/NVIDIA/nccl/issues/795 and https://github.com/NVIDIA/nccl/issues/1486:
    # the peer closed its socket, i.e. exited (the maintainers' reading): the echo of its error
    (
        "a100-st-p4d24xlarge-22:183006:183181 [1] misc/socket.cc:538 NCCL WARN Net : Connection "
        "closed by remote peer a100-st-p4d24xlarge-22.luciodelelis-92732890-0458-4f76-8369-"
        "c4fee80b23e7.pcluster<47861>",
        "nccl peer closed",
    ),
    ("NCCL WARN socketProgress: Connection closed by remote peer", "nccl peer closed progress"),
    # https://github.com/huggingface/huggingface_hub/issues/1007 (a repository that is not there)
    (
        "RepositoryNotFoundError: 401 Client Error: Repository Not Found for url: "
        "https://huggingface.co/cakiki/arxiv_taxonomy/resolve/main/README.md. If the repo is "
        "private, make sure you are authenticated. (Request ID: hMJcPE_5pIwLsE27s2pLt)",
        "repo not found",
    ),
]

# Real lines that are neither transient nor a cause: a server's ordinary noise.
NOISE = [
    # https://github.com/triton-inference-server/server/issues/3353: Triton's HTTP front end
    # when a client hangs up
    "[ERROR] evhtp.c:3101     ODDITY, resuming when not paused?!? :: (errno: Connection reset by"
    " peer)",
]

PHASES: tuple[str, ...] = get_args(TrialPhase)


def _shifted(line: str) -> str:
    """`line` with the digits of every number on its own changed: another occurrence of the
    same fault (other times, threads, ports, addresses, sizes). A number inside a name (FP8,
    SM90, W4A16) names what failed and stays."""
    return re.sub(
        r"(?<![A-Za-z_\d])\d+(?![A-Za-z_\d])",
        lambda m: "".join(str((int(d) + 3) % 10) for d in m.group()),
        line,
    )


# ------------------------------------------------------------------ the table
@pytest.mark.parametrize("row", TRANSIENT, ids=lambda r: r.name)
def test_each_row_matches_its_own_real_line_and_names_it(row: Transient) -> None:
    assert row.pattern.search(row.example)
    phase = min(row.phases) if row.phases else None
    assert signature(row.example, phase).transient == row.name  # no earlier row shadows it
    assert signature(row.example).transient == row.name  # an unknown phase never rules it out


@pytest.mark.parametrize("row", TRANSIENT, ids=lambda r: r.name)
def test_each_row_says_where_its_line_came_from(row: Transient) -> None:
    assert row.source.startswith("https://github.com/") or (REPO / row.source).is_file()
    assert row.phases is None or (row.phases and row.phases <= set(PHASES))


def test_row_names_are_unique() -> None:
    names = [row.name for row in TRANSIENT]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("row", TRANSIENT, ids=lambda r: r.name)
def test_no_row_matches_a_structural_line_or_noise(row: Transient) -> None:
    for line in [*REQUIRED_STRUCTURAL, *(line for line, _ in REAL_STRUCTURAL), *NOISE]:
        assert not row.pattern.search(line), line


# ------------------------------------------------------------------ transient or structural
@pytest.mark.parametrize(("line", "phase", "kind"), REQUIRED_TRANSIENT)
def test_the_simulated_transient_lines_are_transient(line: str, phase: str, kind: str) -> None:
    sig = signature(line, phase)
    assert sig.is_transient and sig.transient == kind


@pytest.mark.parametrize(("line", "phase", "kind"), REAL_TRANSIENT)
def test_real_transient_lines_are_transient(line: str, phase: str | None, kind: str) -> None:
    assert signature(line, phase).transient == kind


@pytest.mark.parametrize("line", REQUIRED_STRUCTURAL)
def test_the_simulated_structural_lines_are_structural(line: str) -> None:
    for phase in (None, *PHASES):
        assert not signature(line, phase).is_transient


def test_the_simulated_structural_lines_have_distinct_signatures() -> None:
    assert len({signature(line, "loading model") for line in REQUIRED_STRUCTURAL}) == 4


@pytest.mark.parametrize(("line", "cause"), REAL_STRUCTURAL)
def test_real_structural_lines_are_not_transient_in_any_phase(line: str, cause: str) -> None:
    for phase in (None, *PHASES):
        assert signature(line, phase).transient is None


def test_real_structural_lines_share_a_signature_exactly_when_they_share_a_cause() -> None:
    sigs = [(signature(line, "loading model"), cause) for line, cause in REAL_STRUCTURAL]
    for a, cause_a in sigs:
        for b, cause_b in sigs:
            assert (a == b) == (cause_a == cause_b), (a.text, b.text)


@pytest.mark.parametrize(
    "line",
    [
        line
        for line in [*REQUIRED_STRUCTURAL, *(line for line, _ in REAL_STRUCTURAL)]
        if re.search(r"\d", line)
    ],
)
def test_another_occurrence_differing_in_numbers_and_addresses_shares_the_signature(
    line: str,
) -> None:
    assert signature(_shifted(line), "measuring") == signature(line, "measuring")


def test_a_number_inside_a_name_tells_two_faults_apart() -> None:
    fp8 = "[TensorRT-LLM][ERROR] Assertion failed: no FP8 GEMM tactic for SM90 (gemm.cpp:231)"
    fp4 = "[TensorRT-LLM][ERROR] Assertion failed: no FP4 GEMM tactic for SM90 (gemm.cpp:187)"
    assert signature(fp8) != signature(fp4)
    assert "FP8" in signature(fp8).text and "SM90" in signature(fp8).text


def test_another_occurrence_with_other_prefixes_and_paths_shares_the_signature() -> None:
    a = REQUIRED_STRUCTURAL[1]
    b = (
        "2024-05-01 12:00:00 [rank3] NCCL error in: /opt/nccl/build/src/init.cc:987, unhandled"
        "   system error (run with NCCL_DEBUG=INFO for details)"
    )
    assert signature(a) == signature(b)
    assert signature(a, "loading model") != signature(a, "measuring")  # the phase is part of it


def test_the_same_line_is_transient_in_its_phase_only() -> None:
    line = "the server was not ready after 1800 s"
    assert signature(line, "loading model").transient == "load timed out"
    assert signature(line, None).transient == "load timed out"  # the tuner's line suffices
    assert signature(line, "measuring").transient is None
    hub_example = next(row.example for row in TRANSIENT if row.name == "hub timeout")
    hub = f"cannot download meta-llama/Llama-3.1-8B: {hub_example}"
    assert signature(hub, "downloading weights").transient == "hub timeout"
    assert signature(hub, "measuring").transient is None  # the benchmark's timeouts are not it


def test_a_missing_repository_is_structural_even_while_downloading() -> None:
    line = next(line for line, cause in REAL_STRUCTURAL if cause == "repo not found")
    sig = signature(f"cannot download cakiki/arxiv_taxonomy: {line}", "downloading weights")
    assert not sig.is_transient


def test_a_transient_line_anywhere_in_the_reason_counts() -> None:
    """The context line or the first error may be structural-looking; an eviction further down
    the log still makes the failure transient (and the signature's text stays the error)."""
    reason = "\n".join(
        [
            "the server died during the benchmark (12 failed)",
            "[TensorRT-LLM][ERROR] Assertion failed: Input length exceeds max (gptDecoder.cpp:88)",
            "4m11s  Warning  Evicted  pod/egg-1  The node was low on resource: memory. ",
        ]
    )
    sig = signature(reason, "measuring")
    assert sig.transient == "pod evicted"
    assert sig.text.startswith("[TensorRT-LLM][ERROR] Assertion failed: Input length exceeds max")


def test_a_real_runner_reason_is_read_as_the_runner_writes_it() -> None:
    log = "\n".join(
        [
            "I0923 10:00:00.000001 77 server.cc:674] loading: tensorrt_llm:1",
            "[TensorRT-LLM][WARNING] max_num_tokens is not specified",
            "W0923 10:00:05.000002 77 pinned_memory_manager.cc:271] Unable to allocate pinned"
            " system memory",
        ]
    )
    status, reason = classify_failure(log, "the server was not ready after 1800 s")
    assert status == "error"
    sig = signature(reason, "loading model")
    assert sig.text == "the server was not ready after # s"
    assert sig.transient == "load timed out"

    crash = log + "\n" + REAL_STRUCTURAL[0][0]
    status, reason = classify_failure(crash, "the server exited before it was ready (exit code 1)")
    sig = signature(reason, "loading model")
    assert not sig.is_transient
    assert (
        sig.text
        == "[TensorRT-LLM][ERROR] Assertion failed: Unsupported architecture (fmhaRunner.cpp:#)"
    )


def test_no_reason_has_an_empty_structural_signature() -> None:
    for reason in (None, "", "  \n "):
        assert signature(reason, "measuring") == Signature("", "measuring", None)


# ------------------------------------------------------------------ the first error line
def test_the_first_error_line_skips_info_and_warnings_and_wins_over_the_context_line() -> None:
    reason = "\n".join(
        [
            "the server exited before it was ready (exit code 1)",
            "I1127 22:02:29.123456 123 model_lifecycle.cc:42] loading: tensorrt_llm:1",
            "[TensorRT-LLM][INFO] Engine version 0.12.0 found in the config file",
            "W1127 22:02:30.000001 123 server.cc:251] failed to enable peer access",
            "terminate called after throwing an instance of 'tensorrt_llm::common::TllmException'",
            REAL_STRUCTURAL[4][0],
            "1       0x7009a217b67c tensorrt_llm::common::throwRuntimeError(char const*, int) + 95",
        ]
    )
    assert first_error_line(reason) == REAL_STRUCTURAL[4][0].strip()


def test_a_traceback_gives_the_exception_line_that_ends_it() -> None:
    reason = "\n".join(
        [
            "the benchmark failed: see the log",
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.12/site-packages/tensorrt_llm/llmapi/llm.py", line 12, in x',
            "    raise ValueError(msg)",
            "ValueError: tp_size 4 does not divide num_attention_heads 6",
        ]
    )
    assert first_error_line(reason) == "ValueError: tp_size 4 does not divide num_attention_heads 6"


def test_a_rank_prefixed_traceback_gives_its_exception_line() -> None:
    reason = "\n".join(
        [
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "/workspace/run.py", line 3, in <module>',
            "[rank0]: RuntimeError: NCCL error in: /src/init.cc:12, invalid usage",
        ]
    )
    assert first_error_line(reason) == (
        "[rank0]: RuntimeError: NCCL error in: /src/init.cc:12, invalid usage"
    )
    assert (
        normalise(first_error_line(reason))
        == "RuntimeError: NCCL error in: init.cc:#, invalid usage"
    )


def test_without_an_error_the_context_line_is_the_signature() -> None:
    reason = "the server died during the benchmark (3 failed)\nI0101 00:00:00.000001 1 a.cc:1] hi"
    assert first_error_line(reason) == "the server died during the benchmark (3 failed)"
    only_noise = "W0101 00:00:00.000001 1 a.cc:1] a warning\nI0101 00:00:00.000002 1 a.cc:2] hi"
    assert first_error_line(only_noise) == "W0101 00:00:00.000001 1 a.cc:1] a warning"


# ------------------------------------------------------------------ normalising
@pytest.mark.parametrize(
    ("a", "b"),
    [
        # timestamps and log prefixes
        (
            "2024-05-01 12:00:00 [TensorRT-LLM][ERROR] Assertion failed: x",
            "2025-11-30T23:59:59.123Z [TensorRT-LLM][ERROR] Assertion failed: x",
        ),
        (
            "I1127 22:02:29.123456 123 file.cc:42] failed to load 'm' version 1: bad",
            "E0101 01:02:03.000004 9 other.cc:7] failed to load 'm' version 1: bad",
        ),
        (
            "triton-srv    | E0723 03:46:11.726061 1 model_repository_manager.cc:1242] failed to "
            "load 'm' version 1: Internal: bad",
            "E0101 01:02:03.000004 9 model_lifecycle.cc:7] failed to load 'm' version 1: "
            "Internal: bad",
        ),
        ("[rank3]: RuntimeError: boom", "[rank0]: RuntimeError: boom"),
        ("[TRT-LLM] [RANK 0] [E] boom", "[TRT-LLM] [RANK 7] [E] boom"),
        ("[04/09/2024-16:26:41] [TRT] [E] boom", "[12/31/2025-01:02:03] [TRT] [E] boom"),
        # addresses, ids, names
        ("segfault at 0x7f3a2c00 in x", "segfault at 0x55d1 in x"),
        (
            "pod uid 123e4567-e89b-12d3-a456-426614174000 gone",
            "pod uid 9f0c1d2e-aaaa-4bbb-8ccc-0123456789ab gone",
        ),
        ("pod tuner-abc12-xyz9k failed", "pod tuner-q8w4z-m2n7p failed"),
        ("pod istio-citadel-894d98c88-zkt23 failed", "pod istio-citadel-5c7d9f8b4-x2v9q failed"),
        ("connect to 10.0.0.4:8001 refused", "connect to 192.168.17.250:443 refused"),
        (
            "connect to [fe80::1%eth0]:8001 refused",
            "connect to [2001:db8::8a2e:370:7334]:9 refused",
        ),
        # paths keep their basename
        ("error (/src/a/b/file.cpp:12)", "error (/home/build/x/file.cpp:99)"),
        ("error ../a/b/file.cpp:12", "error ./file.cpp:7"),
        # numbers and whitespace
        ("max_batch_size 256 > 128", "max_batch_size   512 >\t64"),
    ],
)
def test_lines_that_differ_only_in_what_varies_normalise_equal(a: str, b: str) -> None:
    assert normalise(a) == normalise(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Unsupported architecture (fmhaRunner.cpp:87)", "Unsupported Arch (fmhaRunner.cpp:87)"),
        ("error (/src/a/file.cpp:12)", "error (/src/a/other.cpp:12)"),
        ("FP8 KV cache is not supported", "INT8 KV cache is not supported"),
        ("cannot download openai/gpt-oss-120b: 404", "cannot download meta/llama-70b: 404"),
    ],
)
def test_lines_that_differ_in_words_do_not(a: str, b: str) -> None:
    assert normalise(a) != normalise(b)


def test_normalised_text_reads_well() -> None:
    assert normalise(REAL_STRUCTURAL[12][0]) == (
        "[TensorRT-LLM][ERROR] CUDA runtime error in cudaDeviceGetDefaultMemPool(&memPool, "
        "device): operation not supported (bufferManager.cpp:#)"
    )
    assert normalise("Failed for url: https://huggingface.co/org/m/resolve/main/config.json") == (
        "Failed for url: https://huggingface.co/.../config.json"
    )
    # C++ scopes and Triton's "?!? ::" are not IPv6 addresses
    assert normalise("tensorrt_llm::common::TllmException in ::cudaMallocAsync(ptr)") == (
        "tensorrt_llm::common::TllmException in ::cudaMallocAsync(ptr)"
    )
    assert normalise(NOISE[0]) == (
        "[ERROR] evhtp.c:# ODDITY, resuming when not paused?!? :: (errno: Connection reset by peer)"
    )


def test_normalised_text_is_cut() -> None:
    assert len(normalise("RuntimeError: " + "word " * 100)) == MAX_TEXT
    assert len(signature("RuntimeError: " + "word " * 100).text) == MAX_TEXT


# ------------------------------------------------------------------ labels
def test_labels_name_the_phase_and_the_transient_kind() -> None:
    assert signature("RuntimeError: boom 3", "loading model").label() == (
        "loading model: RuntimeError: boom #"
    )
    assert signature("RuntimeError: boom 3").label() == "RuntimeError: boom #"
    assert signature("the server was not ready after 1800 s", "loading model").label() == (
        "loading model: the server was not ready after # s (transient: load timed out)"
    )
    assert signature(None).label() == "no reason recorded"
