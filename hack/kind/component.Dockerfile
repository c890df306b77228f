# One control-plane component image for the kind node (localcluster/kindnode.py):
# the binary built from the pinned Go module, tagged with the name kubeadm asks for.
FROM debian:bookworm-slim
# kube-proxy needs iptables and conntrack; the other components need nothing.
ARG PACKAGES=""
RUN if [ -n "$PACKAGES" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $PACKAGES \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ARG BINARY
COPY $BINARY /usr/local/bin/$BINARY
# Static pods and DaemonSets name their command (kube-apiserver, etcd,
# /usr/local/bin/kube-proxy); CoreDNS's Deployment gives only arguments, so the
# entrypoint is the binary (exec-form ENTRYPOINT cannot expand an ARG: a link).
RUN ln -s "/usr/local/bin/$BINARY" /usr/local/bin/component
ENTRYPOINT ["/usr/local/bin/component"]
