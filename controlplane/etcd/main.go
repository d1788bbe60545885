// Command etcd is upstream's etcd server, built from its published module for the test
// control plane (Debian's etcd 3.4 is older than what a current kube-apiserver supports).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
