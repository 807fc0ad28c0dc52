// Command gpu-dra-plugin is the real node's DRA kubelet plugin for tests: it publishes the
// node's GPUs (each /dev/nvidiaN) as devices of driver gpu.nvidia.com in one ResourceSlice,
// pool named after the node, devices gpu-N with the attributes NVIDIA's DRA driver publishes
// (index, uuid, productName), as the control plane's fixture driver does (tests/src/dra.rs).
// The kubelet calls it to prepare a claim allocated on the node: it writes one CDI spec for
// the claim and hands back its CDI device, which gives the container what the device plugin
// (tests/cluster/deviceplugin) gives today: the device nodes of exactly the claim's GPUs, the
// control and UVM nodes, the driver's user-space libraries bound in under their sonames (with
// -driver-lib), and NVIDIA_VISIBLE_DEVICES and GPUFABRIC_DRA_DEVICES naming the GPUs.
// Unpreparing the claim removes its spec. A fault file (-fault-file) makes the node's side
// break as the device plugin's does, read at every prepare: "hidden-gpu" leaves the last of
// the claim's GPUs' device nodes out, "sdc" sets the agent's SDC test hook. No NVML, no MIG, no sharing, no health checks: the
// kubelet's DRA API, the scheduler's allocation and the runtime's CDI are what it is for.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1beta1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// The driver's name, NVIDIA's: the operator and its DeviceClass select devices by it.
const driverName = "gpu.nvidia.com"

// cdiKind is the CDI vendor and class of the claims' devices ("vendor/class=name").
const cdiKind = "gpufabric.local/claim"

var (
	nodeName    = flag.String("node-name", "", "the Node whose GPUs these are (required)")
	kubeconfig  = flag.String("kubeconfig", "", "a kubeconfig that may write ResourceSlices and read ResourceClaims (required)")
	kubeletRoot = flag.String("kubelet-root", "/var/lib/kubelet", "the kubelet's --root-dir (its plugins_registry and plugins directories are under it)")
	cdiDir      = flag.String("cdi-dir", "/var/run/cdi", "where the container runtime reads CDI specs")
	devDir      = flag.String("dev", "/dev", "where the GPU device nodes are")
	driverLib   = flag.String("driver-lib", "", "the directory of the driver's libcuda.so.1 (none: no libraries bound in)")
	procDir     = flag.String("proc-gpus", "/proc/driver/nvidia/gpus", "the driver's per-GPU information (uuid, model), where there is one")
	product     = flag.String("product", "Fake GPU", "the productName of GPUs the driver does not describe")
	faultFile   = flag.String("fault-file", "", "a file whose content makes a node-side fault (hidden-gpu, sdc)")
)

type plugin struct {
	gpus   []gpu
	mounts []mount
}

// PrepareResourceClaims writes each claim's CDI spec (its GPUs of this node) and answers its
// one CDI device for the claim's first device of this driver.
func (p *plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = p.prepare(ctx, c)
	}
	return out, nil
}

func (p *plugin) prepare(ctx context.Context, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	var results []resourceapi.DeviceRequestAllocationResult
	if c.Status.Allocation != nil {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == driverName && r.Pool == *nodeName {
				results = append(results, r)
			}
		}
	}
	var indexes []int
	for _, r := range results {
		i, err := strconv.Atoi(strings.TrimPrefix(r.Device, "gpu-"))
		if err != nil || !p.has(i) {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: device %q is none of this node's GPUs", c.Namespace, c.Name, r.Device)}
		}
		indexes = append(indexes, i)
	}
	sort.Ints(indexes)
	name := cdiName(c.UID)
	if err := writeSpec(filepath.Join(*cdiDir, specFile(c.UID)), p.spec(name, indexes)); err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: writing its CDI spec: %w", c.Namespace, c.Name, err)}
	}
	devices := make([]kubeletplugin.Device, 0, len(results))
	for i, r := range results {
		d := kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device}
		if i == 0 {
			d.CDIDeviceIDs = []string{cdiKind + "=" + name}
		}
		devices = append(devices, d)
	}
	klog.FromContext(ctx).Info("prepared", "claim", klog.KObj(c), "uid", c.UID, "gpus", indexes, "cdi", cdiKind+"="+name, "fault", fault())
	return kubeletplugin.PrepareResult{Devices: devices}
}

func (p *plugin) has(i int) bool {
	for _, g := range p.gpus {
		if g.index == i {
			return true
		}
	}
	return false
}

// UnprepareResourceClaims removes each claim's CDI spec (none there is no error).
func (p *plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := os.Remove(filepath.Join(*cdiDir, specFile(c.UID)))
		if os.IsNotExist(err) {
			err = nil
		}
		out[c.UID] = err
		klog.FromContext(ctx).Info("unprepared", "claim", c.String(), "err", err)
	}
	return out, nil
}

func cdiName(uid types.UID) string  { return "claim-" + string(uid) }
func specFile(uid types.UID) string { return "gpufabric-claim-" + string(uid) + ".json" }

// The CDI spec of one claim: one device whose edits are the claim's.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string        `json:"env,omitempty"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
	Mounts      []cdiMount      `json:"mounts,omitempty"`
}

type cdiDeviceNode struct {
	Path        string `json:"path"`
	HostPath    string `json:"hostPath"`
	Permissions string `json:"permissions"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options"`
}

// fault is the node-side fault of the moment (the fault file's content; none without one).
func fault() string {
	if *faultFile == "" {
		return ""
	}
	b, err := os.ReadFile(*faultFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (p *plugin) spec(name string, indexes []int) cdiSpec {
	names := make([]string, len(indexes))
	numbers := make([]string, len(indexes))
	var nodes []cdiDeviceNode
	given := indexes
	f := fault()
	if f == "hidden-gpu" && len(given) > 0 {
		given = given[:len(given)-1]
	}
	for i, g := range indexes {
		names[i] = fmt.Sprintf("gpu-%d", g)
		numbers[i] = strconv.Itoa(g)
	}
	for _, g := range given {
		nodes = append(nodes, deviceNode(fmt.Sprintf("nvidia%d", g)))
	}
	for _, n := range controlNodes {
		if _, err := os.Stat(filepath.Join(*devDir, n)); err == nil {
			nodes = append(nodes, deviceNode(n))
		}
	}
	var mounts []cdiMount
	for _, m := range p.mounts {
		mounts = append(mounts, cdiMount{HostPath: m.host, ContainerPath: m.container,
			Options: []string{"ro", "nosuid", "nodev", "bind"}})
	}
	env := []string{
		"NVIDIA_VISIBLE_DEVICES=" + strings.Join(numbers, ","),
		"GPUFABRIC_DRA_DEVICES=" + strings.Join(names, ","),
	}
	if f == "sdc" && len(given) > 0 {
		env = append(env, "FABRIC_TEST_FLIP_SDC_BIT="+strconv.Itoa(len(given)-1))
	}
	return cdiSpec{Version: "0.5.0", Kind: cdiKind, Devices: []cdiDevice{{Name: name, Edits: cdiEdits{
		Env:         env,
		DeviceNodes: nodes,
		Mounts:      mounts,
	}}}}
}

func deviceNode(name string) cdiDeviceNode {
	return cdiDeviceNode{Path: "/dev/" + name, HostPath: filepath.Join(*devDir, name), Permissions: "rw"}
}

// writeSpec writes a spec whole: the runtime never reads half a file.
func writeSpec(path string, spec cdiSpec) error {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// slice is the node's one pool: device gpu-N for each GPU N.
func (p *plugin) slice() resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(p.gpus))
	for _, g := range p.gpus {
		devices = append(devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", g.index),
			Basic: &resourceapi.BasicDevice{Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index":       {IntValue: ptr.To(int64(g.index))},
				"uuid":        {StringValue: ptr.To(g.uuid)},
				"productName": {StringValue: ptr.To(g.product)},
			}},
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

func main() {
	klog.InitFlags(nil)
	flag.Parse()
	logger := klog.Background()
	if *nodeName == "" || *kubeconfig == "" {
		fail("-node-name and -kubeconfig are required")
	}
	gpus, err := findGPUs(*devDir, *procDir, *nodeName, *product)
	if err != nil || len(gpus) == 0 {
		fail(fmt.Sprintf("no GPU device nodes in %s (%v)", *devDir, err))
	}
	p := &plugin{gpus: gpus}
	if *driverLib != "" {
		if p.mounts, err = libMounts(*driverLib); err != nil {
			fail(err.Error())
		}
		for _, m := range p.mounts {
			logger.Info("driver library", "host", m.host, "container", m.container)
		}
	}
	registry := filepath.Join(*kubeletRoot, "plugins_registry")
	sockets := filepath.Join(*kubeletRoot, "plugins", driverName)
	for _, d := range []string{*cdiDir, registry, sockets} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fail(err.Error())
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(fmt.Sprintf("reading %s: %v", *kubeconfig, err))
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail(err.Error())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, logger)
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.NodeName(*nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.PluginDataDirectoryPath(sockets),
	)
	if err != nil {
		fail(fmt.Sprintf("starting the kubelet plugin: %v", err))
	}
	if err := helper.PublishResources(ctx, p.slice()); err != nil {
		fail(fmt.Sprintf("publishing the GPUs: %v", err))
	}
	logger.Info("serving", "driver", driverName, "node", *nodeName, "gpus", len(gpus), "cdiDir", *cdiDir)
	<-ctx.Done()
	helper.Stop()
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "gpu-dra-plugin:", msg)
	os.Exit(1)
}
