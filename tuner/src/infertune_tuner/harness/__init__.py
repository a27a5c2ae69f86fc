"""The benchmark harness: what turns a running Triton server into TTFT/ITL/E2E and throughput.

- `trace`: what the client saw of one request; `stats`: traces -> percentiles (pure,
  GenAI-Perf's and AIPerf's definitions)
- `loadgen`: the streaming load generator (closed loop / request rate) for a
  `load_spec.LoadSpec`; `stream`: one streaming request (a closed-loop worker's stream, the stall
  bound); `protocol`: the KServe v2 gRPC stream on tritonclient's protobuf stubs (Triton's empty
  final response); `tokens`: how many tokens a response carries; `prompts`: the inputs a
  model's metadata asks for, synthetic prompts
- `engine`: continuous-batching engine timed by the performance model (pure), and
  `modelled_steady_state`, the reference an ideal client would measure
- `simserver`: a simulated Triton speaking KServe v2 gRPC (`sim_service`), driven by `engine`;
  its command is the tuner's (`infertune simserver`, `python -m infertune_tuner.cli.simserver`)
- `runner`: one real trial: start a server, wait for readiness, drive load, tear down, classify
- `guard`: the process between the tuner and a trial server, so no server outlives the tuner

What a server is (its repository files and launch command) is the serving runtime's business
(`infertune_tuner.runtime`), shared with the operator's serving Deployment.

Modules are imported on demand; importing this package loads no gRPC.
"""
