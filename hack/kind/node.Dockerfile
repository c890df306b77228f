# A kind node image made from local parts only (localcluster/kindnode.py makes the
# context; docs/dev/kind-node-image.md explains it). It follows kind's base image
# (images/base/Dockerfile in the sigs.k8s.io/kind module): Debian with systemd,
# kind's files, containerd/runc/crictl/CNI plugins, then kubelet/kubeadm/kubectl,
# all built here from pinned Go modules instead of downloaded.
FROM debian:bookworm-slim

COPY --chmod=0755 kind-files/usr/local/bin/ /usr/local/bin/
COPY --chmod=0644 kind-files/kind/ /kind/
COPY --chmod=0755 kind-files/kind/bin/ /kind/bin/
COPY --chmod=0644 kind-files/etc/ /etc/

# Packages and systemd trimming as kind's base image does (without the storage
# test packages: nfs-common, open-iscsi, fuse-overlayfs).
RUN chmod 755 /kind /kind/bin \
    && DEBIAN_FRONTEND=noninteractive clean-install \
      systemd \
      conntrack iptables nftables iproute2 ethtool util-linux mount kmod \
      libseccomp2 pigz bash ca-certificates curl jq procps \
    && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
    && rm -f /lib/systemd/system/multi-user.target.wants/* \
    && rm -f /etc/systemd/system/*.wants/* \
    && rm -f /lib/systemd/system/local-fs.target.wants/* \
    && rm -f /lib/systemd/system/sockets.target.wants/*udev* \
    && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \
    && rm -f /lib/systemd/system/basic.target.wants/* \
    && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
    && ln -s /usr/lib/systemd/systemd /sbin/init

COPY --chmod=0755 bin/containerd bin/ctr bin/containerd-shim-runc-v2 bin/crictl /usr/local/bin/
COPY --chmod=0755 bin/runc /usr/local/sbin/runc
COPY --chmod=0755 cni/ /opt/cni/bin/
# kind's kubelet unit expects /usr/bin/kubelet.
COPY --chmod=0755 bin/kubelet bin/kubeadm bin/kubectl /usr/bin/
# Our settings over kind's (containerd config, its OOM drop-in, the CNI config,
# the manifests kind applies) and /kind/version.
COPY overlay/ /

ARG SANDBOX_IMAGE
RUN sed -i "s|@SANDBOX_IMAGE@|${SANDBOX_IMAGE}|" /etc/containerd/config.toml \
    && ctr oci spec \
        | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
        | jq 'del(.process.rlimits)' \
        > /etc/containerd/cri-base.json \
    && containerd --version && runc --version && kubelet --version \
    && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
    && systemctl mask systemd-binfmt.service \
    && mkdir -p /etc/kubernetes/manifests

ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
