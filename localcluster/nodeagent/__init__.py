"""A local node agent: runs the pods that the scheduler binds to its nodes as processes.

Kind cannot run on machines without a Docker engine, so the operator's pods
would never really run there. This agent registers Node objects (`local-0`,
`local-1`, ...) with the local control plane (localcluster.cluster) and executes
every pod bound to them as plain processes, each pod in its own network, UTS
and mount namespace, so that the launcher really reaches the workers over ssh
by their DNS names. Images are not pulled: the host's installed packages (the
repository's .venv first on PATH) stand in for every image.

    python -m localcluster.nodeagent run --kubeconfig K      register nodes, run pods until SIGTERM
    python -m localcluster.nodeagent logs POD [-n NS] [-f]    a pod's container log
    python -m localcluster.nodeagent ps                        pods, their namespaces, IPs and pids
    python -m localcluster.nodeagent exec POD -- CMD...        run a command inside a pod
    python -m localcluster.nodeagent cleanup                   remove what a crashed agent left

See docs/dev/local-e2e.md for how it works.
"""
