"""The development tooling: a real Kubernetes control plane run as local processes,
a node agent that runs pods as processes, and what tests and benchmarks share to
drive them (one Go builder, one versions reader, one JSON client, one poller, one
operator-process launcher).

It lives at the top level, not under tests/, because the demo (`hack/demo.sh`),
the benchmarks (`bench/`) and the tests all use it; it is not shipped in any
image or distribution. `hack/` keeps the shell entry points and version pins.
Everything but the node agent and the JSON client is standard library only:
`hack/cluster.sh` runs it before any virtualenv exists.
"""
