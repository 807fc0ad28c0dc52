// Command gpu-device-plugin is the real node's GPU device plugin for tests on a GPU host: it
// advertises each /dev/nvidiaN as one `nvidia.com/gpu` and hands a container exactly the GPUs
// the kubelet allocated to it, as NVIDIA's container toolkit would (their device nodes, the
// control and UVM nodes, and the driver's user-space libraries bound in under their sonames),
// with no container toolkit, no CDI and no NVML: what a test needs to see a pod get its own
// GPUs and nothing else.
//
// A fault file (-fault-file) makes the node's side break as hardware would, read at every
// allocation: "hidden-gpu" hands a container allocated N GPUs only N-1 of their device nodes
// (the node advertises a GPU its pods cannot see); "sdc" sets the agent's test hook that flips
// one bit of the last GPU's silent-data-corruption output (a GPU computing a wrong result).
package main

import (
	"context"
	"debug/elf"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var (
	resource  = flag.String("resource", "nvidia.com/gpu", "the extended resource advertised")
	dir       = flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device plugin directory")
	devDir    = flag.String("dev", "/dev", "where the GPU device nodes are")
	driverLib = flag.String("driver-lib", "", "the directory of the driver's libcuda.so.1 (required)")
	faultFile = flag.String("fault-file", "", "a file whose content makes a node-side fault (hidden-gpu)")
)

// The driver libraries a CUDA and NVML program loads, by name prefix, as the toolkit's
// "compute,utility" capabilities mount them.
var driverLibs = []string{"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
	"libnvidia-nvvm.so", "libnvidia-gpucomp.so", "libcudadebugger.so"}

type plugin struct {
	gpus   []int
	mounts []*pluginapi.Mount
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	devs := make([]*pluginapi.Device, 0, len(p.gpus))
	for _, g := range p.gpus {
		devs = append(devs, &pluginapi.Device{ID: id(g), Health: pluginapi.Healthy})
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	fault := ""
	if *faultFile != "" {
		if b, err := os.ReadFile(*faultFile); err == nil {
			fault = strings.TrimSpace(string(b))
		}
	}
	out := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		gpus := make([]int, 0, len(c.DevicesIDs))
		for _, d := range c.DevicesIDs {
			g, err := strconv.Atoi(strings.TrimPrefix(d, "gpu-"))
			if err != nil {
				return nil, fmt.Errorf("unknown device %q", d)
			}
			gpus = append(gpus, g)
		}
		sort.Ints(gpus)
		given := gpus
		if fault == "hidden-gpu" && len(given) > 0 {
			given = given[:len(given)-1]
		}
		resp := &pluginapi.ContainerAllocateResponse{
			Envs:   map[string]string{"NVIDIA_VISIBLE_DEVICES": join(given)},
			Mounts: p.mounts,
		}
		if fault == "sdc" && len(given) > 0 {
			resp.Envs["FABRIC_TEST_FLIP_SDC_BIT"] = strconv.Itoa(len(given) - 1)
		}
		for _, g := range given {
			resp.Devices = append(resp.Devices, node(fmt.Sprintf("nvidia%d", g)))
		}
		for _, n := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
			if _, err := os.Stat(filepath.Join(*devDir, n)); err == nil {
				resp.Devices = append(resp.Devices, node(n))
			}
		}
		log.Printf("allocate %v: device nodes of %v (fault %q)", c.DevicesIDs, given, fault)
		out.ContainerResponses = append(out.ContainerResponses, resp)
	}
	return out, nil
}

func id(g int) string { return fmt.Sprintf("gpu-%d", g) }

func join(gpus []int) string {
	s := make([]string, len(gpus))
	for i, g := range gpus {
		s[i] = strconv.Itoa(g)
	}
	return strings.Join(s, ",")
}

func node(name string) *pluginapi.DeviceSpec {
	p := filepath.Join(*devDir, name)
	return &pluginapi.DeviceSpec{ContainerPath: "/dev/" + name, HostPath: p, Permissions: "rw"}
}

// gpus lists the N of every /dev/nvidiaN.
func gpus() ([]int, error) {
	entries, err := os.ReadDir(*devDir)
	if err != nil {
		return nil, err
	}
	re := regexp.MustCompile(`^nvidia([0-9]+)$`)
	var out []int
	for _, e := range entries {
		if m := re.FindStringSubmatch(e.Name()); m != nil {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// libMounts binds each driver library of driverLibs into the container's library directory
// under its soname, read-only.
func libMounts(dir string) ([]*pluginapi.Mount, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []*pluginapi.Mount
	for _, e := range entries {
		name := e.Name()
		wanted := false
		for _, l := range driverLibs {
			if strings.HasPrefix(name, l+".") {
				wanted = true
			}
		}
		if !wanted {
			continue
		}
		host, err := filepath.EvalSymlinks(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		f, err := elf.Open(host)
		if err != nil {
			continue
		}
		sonames, err := f.DynString(elf.DT_SONAME)
		f.Close()
		if err != nil || len(sonames) == 0 || seen[sonames[0]] {
			continue
		}
		seen[sonames[0]] = true
		out = append(out, &pluginapi.Mount{
			ContainerPath: "/usr/lib/x86_64-linux-gnu/" + sonames[0], HostPath: host, ReadOnly: true})
	}
	if !seen["libcuda.so.1"] || !seen["libnvidia-ml.so.1"] {
		return nil, fmt.Errorf("%s holds no libcuda.so.1 and libnvidia-ml.so.1", dir)
	}
	return out, nil
}

func main() {
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if *driverLib == "" {
		log.Fatal("-driver-lib is required: the directory of the driver's libcuda.so.1")
	}
	g, err := gpus()
	if err != nil || len(g) == 0 {
		log.Fatalf("no GPU device nodes in %s (%v)", *devDir, err)
	}
	mounts, err := libMounts(*driverLib)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range mounts {
		log.Printf("driver library %s -> %s", m.HostPath, m.ContainerPath)
	}
	p := &plugin{gpus: g, mounts: mounts}
	sock := filepath.Join(*dir, "gpufabric-gpu.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { log.Fatal(srv.Serve(lis)) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(*dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	reg := pluginapi.NewRegistrationClient(conn)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = reg.Register(ctx, &pluginapi.RegisterRequest{
			Version: pluginapi.Version, Endpoint: filepath.Base(sock), ResourceName: *resource})
		cancel()
		if err == nil {
			break
		}
		log.Printf("registering with the kubelet: %v (again in 1 s)", err)
		time.Sleep(time.Second)
	}
	conn.Close()
	log.Printf("registered %s: %d GPU(s) %v", *resource, len(g), g)
	select {}
}
