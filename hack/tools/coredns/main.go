// A CoreDNS with only the plugins the local node agent's Corefile uses.
//
// The full CoreDNS binary links every plugin (cloud DNS providers included);
// this one links the kubernetes plugin and a few small ones, so it builds in a
// fraction of the time on our 2-core machines. Built by hack/nodeagent/dns.py.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/template"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
