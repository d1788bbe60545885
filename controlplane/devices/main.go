// podresources-client asks a kubelet's pod-resources API (podresources.v1) what it reports and
// prints the answer as JSON, for tests/e2e_devices.rs.
//
//	podresources-client SOCKET list|allocatable|get NAMESPACE NAME
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: podresources-client SOCKET list|allocatable|get NAMESPACE NAME")
		os.Exit(2)
	}
	socket, verb := os.Args[1], os.Args[2]
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := podresourcesapi.NewPodResourcesListerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var answer any
	switch verb {
	case "list":
		answer, err = client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	case "allocatable":
		answer, err = client.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	case "get":
		if len(os.Args) != 5 {
			fail(fmt.Errorf("get needs NAMESPACE NAME"))
		}
		answer, err = client.Get(ctx, &podresourcesapi.GetPodResourcesRequest{PodNamespace: os.Args[3], PodName: os.Args[4]})
	default:
		fail(fmt.Errorf("unknown verb %q", verb))
	}
	if err != nil {
		fail(err)
	}
	out, err := json.Marshal(answer)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "podresources-client:", err)
	os.Exit(1)
}
