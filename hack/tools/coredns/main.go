// A CoreDNS with only the plugins two Corefiles use: the local node agent's, and
// the one kubeadm writes (the kind node image runs this build as its cluster DNS).
//
// The full CoreDNS binary links every plugin (cloud DNS providers included);
// this one links the kubernetes plugin and a few small ones, so it builds in a
// fraction of the time on our 2-core machines. Built by localcluster/gobuild.py.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
