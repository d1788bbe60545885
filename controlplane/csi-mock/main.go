// A CSI node plugin for the end-to-end tests (tests/e2e_csi.rs): upstream's CSI mock driver
// (k8s.io/kubernetes/test/e2e/storage/drivers/csi-test, the driver formerly published as
// csi-test's mock-driver), served on a Unix socket, with its own gRPC call log on stderr
// ("gRPCCall: {json}" lines), and a registration server speaking the kubelet's
// pluginregistration.v1 protocol on a socket in the kubelet's plugins_registry, as
// node-driver-registrar does (there is no module of the registrar to build).
package main

import (
	"context"
	"flag"
	"net"
	"os"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// registrar answers the kubelet's plugin watcher.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
	versions       []string
}

func (r registrar) GetInfo(ctx context.Context, req *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	klog.Infof("registration: GetInfo")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: r.versions,
	}, nil
}

func (r registrar) NotifyRegistrationStatus(ctx context.Context, status *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	klog.Infof("registration: NotifyRegistrationStatus registered=%v error=%q", status.PluginRegistered, status.Error)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// ephemeralNode serves the publish and unpublish of inline ephemeral volumes itself and
// everything else through the mock: the mock's NodePublishVolume reads the context of a
// volume it does not have for an ephemeral one (a nil *csi.Volume in k8s.io/kubernetes
// v1.37.2's mock/service/node.go), which ends the process.
type ephemeralNode struct {
	service.Service
	mu        sync.Mutex
	published map[string]string // volume ID -> target path
}

func (e *ephemeralNode) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if req.GetVolumeContext()["csi.storage.k8s.io/ephemeral"] != "true" {
		return e.Service.NodePublishVolume(ctx, req)
	}
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "Volume ID cannot be empty")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "Target Path cannot be empty")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "Volume Capability cannot be empty")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.published[req.GetVolumeId()] = req.GetTargetPath()
	return &csi.NodePublishVolumeResponse{}, nil
}

func (e *ephemeralNode) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	e.mu.Lock()
	_, ephemeral := e.published[req.GetVolumeId()]
	delete(e.published, req.GetVolumeId())
	e.mu.Unlock()
	if ephemeral {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	return e.Service.NodeUnpublishVolume(ctx, req)
}

func main() {
	csiAddress := flag.String("csi-address", "", "the CSI driver's Unix socket")
	registration := flag.String("registration-socket", "", "the registration socket (in <root-dir>/plugins_registry); empty: none")
	name := flag.String("name", service.Name, "the driver's name")
	version := flag.String("supported-version", "1.0.0", "the CSI version announced to the kubelet")
	attachLimit := flag.Int64("attach-limit", 0, "maxVolumesPerNode (0: none)")
	topology := flag.Bool("enable-topology", false, "report the mock's topology segment")
	nodeExpand := flag.Bool("node-expand", false, "advertise EXPAND_VOLUME (NodeExpandVolume)")
	klog.InitFlags(nil)
	flag.Parse()

	s := service.New(service.Config{
		DisableAttach:  true,
		DriverName:     *name,
		AttachLimit:    *attachLimit,
		EnableTopology: *topology,
		// NodeExpandVolume is served either way; this advertises it to the kubelet.
		NodeExpansionRequired: *nodeExpand,
	})
	// NewCSIDriver's own interceptor logs every call as "gRPCCall: {json}" (klog -v=3).
	d := driver.NewCSIDriver(&driver.CSIDriverServers{
		Controller: s,
		Identity:   s,
		Node:       &ephemeralNode{Service: s, published: map[string]string{}},
	})
	_ = os.Remove(*csiAddress)
	cl, err := net.Listen("unix", *csiAddress)
	if err != nil {
		klog.Fatalf("CSI socket %s: %v", *csiAddress, err)
	}
	if err := d.Start(cl, nil); err != nil {
		klog.Fatalf("CSI server: %v", err)
	}
	klog.Infof("CSI mock driver %s serving on %s", *name, *csiAddress)
	if *registration != "" {
		_ = os.Remove(*registration)
		l, err := net.Listen("unix", *registration)
		if err != nil {
			klog.Fatalf("registration socket %s: %v", *registration, err)
		}
		srv := grpc.NewServer()
		registerapi.RegisterRegistrationServer(srv, registrar{name: *name, endpoint: *csiAddress, versions: []string{*version}})
		klog.Infof("registration server on %s", *registration)
		go func() { _ = srv.Serve(l) }()
	}
	select {}
}
