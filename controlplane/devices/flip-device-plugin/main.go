// flip-device-plugin serves two devices of one resource through upstream's own device plugin
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1, the Stub the sample device
// plugin is made of) and changes their health on a signal, for scripts/bench-devices: the time
// from a device turning unhealthy to the Node's allocatable showing it. Upstream's sample
// plugin keeps its devices Healthy for ever, so it cannot give that figure.
//
//	SIGUSR1  Flip-1 turns Unhealthy (Flip-2 stays Healthy)
//	SIGUSR2  both Healthy again
//	SIGTERM  stop (the socket is removed)
//
// Environment: PLUGIN_SOCK_DIR (where its socket goes; /var/lib/kubelet/device-plugins),
// RESOURCE (example.com/flip). It registers at /var/lib/kubelet/device-plugins/kubelet.sock,
// as every plugin built on the Stub does. Each change is logged as "sent health" with the
// wall-clock time it was handed to the kubelet's ListAndWatch stream.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

func main() {
	ctx := context.Background()
	logger := klog.Background()
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)

	sockDir := envOr("PLUGIN_SOCK_DIR", pluginapi.DevicePluginPath)
	resource := envOr("RESOURCE", "example.com/flip")
	socket := fmt.Sprintf("%s/flip.%d", sockDir, time.Now().UnixNano())

	stub := plugin.NewDevicePluginStub(logger, devices(true), socket, resource, false, false)
	if err := stub.Start(ctx); err != nil {
		logger.Error(err, "cannot serve the device plugin socket", "socket", socket)
		os.Exit(1)
	}
	if err := stub.Register(ctx, pluginapi.KubeletSocket, resource, pluginapi.DevicePluginPath); err != nil {
		logger.Error(err, "cannot register with the kubelet", "kubeletSocket", pluginapi.KubeletSocket)
		_ = stub.Stop(logger)
		os.Exit(1)
	}
	logger.Info("registered", "resource", resource, "socket", socket)
	for sig := range signals {
		switch sig {
		case syscall.SIGUSR1:
			send(logger, stub, devices(false))
		case syscall.SIGUSR2:
			send(logger, stub, devices(true))
		default:
			logger.Info("stopping", "signal", sig.String())
			if err := stub.Stop(logger); err != nil {
				logger.Error(err, "stopping the device plugin")
			}
			return
		}
	}
}

// devices: Flip-1 with the given health, Flip-2 always Healthy.
func devices(firstHealthy bool) []*pluginapi.Device {
	first := pluginapi.Unhealthy
	if firstHealthy {
		first = pluginapi.Healthy
	}
	return []*pluginapi.Device{
		{ID: "Flip-1", Health: first},
		{ID: "Flip-2", Health: pluginapi.Healthy},
	}
}

// send hands the devices to the ListAndWatch stream. The Stub's Update blocks until a stream
// takes them, so it waits at most 10 s (no kubelet listening) and says so.
func send(logger klog.Logger, stub *plugin.Stub, devs []*pluginapi.Device) {
	done := make(chan struct{})
	go func() {
		stub.Update(devs)
		close(done)
	}()
	select {
	case <-done:
		logger.Info("sent health", "flip1", devs[0].Health, "unixNano", time.Now().UnixNano())
	case <-time.After(10 * time.Second):
		logger.Info("no ListAndWatch stream took the update within 10 s", "flip1", devs[0].Health)
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
